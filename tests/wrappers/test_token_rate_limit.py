"""TokenRateLimit: tokens and requests per sliding minute, reserved before and settled after."""

from __future__ import annotations

import math
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from guardstack.pipeline import (
    MODEL_RATE_LIMITED,
    ConfigError,
    Harness,
    MemoryStore,
    ModelError,
    ModelReply,
    ModelRequest,
    Usage,
)
from guardstack.wrappers import Retry, TokenRateLimit, no_backoff

MINUTE = 60.0


@attrs.define
class Metered:
    """A model stating ``max_tokens``; each call answers after ``latency_s`` with the
    usage its request names (``{"in": n, "out": m}`` in the last message's content)."""

    max_tokens: int = 100
    model: str = "m"
    latency_s: float = 0.5
    calls: list[float] = attrs.Factory(list)
    fail: ModelError | None = None

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
        self.calls.append(anyio.current_time())
        await anyio.sleep(self.latency_s)
        if self.fail is not None:
            raise self.fail
        used = messages[-1].get("used", (10, 20))
        return ModelReply("ok", usage=Usage(*used), model=self.model)


async def aligned() -> float:
    """Move the clock to the start of a second (a sliding minute's bucket) and say when."""
    now = anyio.current_time()
    await anyio.sleep(math.ceil(now) - now + 1)
    return anyio.current_time()


def request_for(
    harness: Harness, chars: int = 40, used: tuple[int, int] = (10, 20)
) -> ModelRequest:
    agent = harness.loop.create(f"a{id(object())}")
    return ModelRequest(agent, [{"role": "user", "content": "x" * chars, "used": used}], [])


def test_a_limit_of_nothing_and_bad_limits_fail_loud() -> None:
    with pytest.raises(ConfigError, match="tokens_per_minute"):
        TokenRateLimit()
    for key, value in (
        ("tokens_per_minute", 0),
        ("requests_per_minute", -1),
        ("tokens_per_minute", 1.5),
    ):
        with pytest.raises(ConfigError) as raised:
            TokenRateLimit(**{key: value})  # type: ignore[arg-type]
        assert raised.value.key == key
    with pytest.raises(ConfigError):
        TokenRateLimit(1000, wait="yes")  # type: ignore[arg-type]


async def test_a_burst_of_long_prompts_waits_for_the_minute_to_slide() -> None:
    """Each request reserves 40/4 + 1 input + 100 output = 111 tokens; 300 a minute let
    two in at once, and the third waits until the first's second has slid out."""
    model = Metered(latency_s=0.1)
    harness = Harness(model)
    harness.plugin(TokenRateLimit(tokens_per_minute=300))
    start = await aligned()

    async def one() -> None:
        await harness.loop.call_model(request_for(harness, used=(111, 0)))

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(one)
    assert [round(t - start, 3) for t in model.calls] == [0.0, 0.0, 61.0]


async def test_without_waiting_a_request_is_refused_with_when_to_come_back() -> None:
    harness = Harness(Metered(latency_s=0.0))
    harness.plugin(TokenRateLimit(tokens_per_minute=300, wait=False))
    await aligned()
    await harness.loop.call_model(request_for(harness, used=(111, 0)))
    await harness.loop.call_model(request_for(harness, used=(111, 0)))
    await anyio.sleep(10.5)
    with pytest.raises(ModelError) as raised:
        await harness.loop.call_model(request_for(harness))
    assert raised.value.code == MODEL_RATE_LIMITED
    assert raised.value.refused
    assert raised.value.retry_after_s == pytest.approx(50.5)
    assert "222 of its 300 tokens per minute are in use" in raised.value.message


async def test_what_the_reply_used_replaces_the_estimate() -> None:
    """Replies that used 30 tokens each leave room for more than the estimates would."""
    model = Metered(latency_s=0.0)
    harness = Harness(model)
    harness.plugin(TokenRateLimit(tokens_per_minute=300, wait=False))
    for _ in range(7):  # estimates alone would let two in (2 x 111 of 300)
        await harness.loop.call_model(request_for(harness, used=(10, 20)))
    with pytest.raises(ModelError) as raised:  # 7 x 30 = 210 settled; 111 more would pass
        await harness.loop.call_model(request_for(harness))
    assert "210 of its 300 tokens" in raised.value.message
    assert len(model.calls) == 7


async def test_a_request_larger_than_the_limit_is_refused_at_once() -> None:
    harness = Harness(Metered())
    harness.plugin(TokenRateLimit(tokens_per_minute=100))  # one request reserves 111
    started = anyio.current_time()
    with pytest.raises(ModelError) as raised:
        await harness.loop.call_model(request_for(harness))
    assert anyio.current_time() == started
    assert raised.value.retry_after_s is None
    assert "larger than the limit of 100 tokens per minute" in raised.value.message


async def test_requests_per_minute_count_with_the_tokens() -> None:
    model = Metered(latency_s=0.0)
    harness = Harness(model)
    harness.plugin(TokenRateLimit(requests_per_minute=2, wait=False))
    await harness.loop.call_model(request_for(harness))
    await harness.loop.call_model(request_for(harness))
    with pytest.raises(ModelError) as raised:
        await harness.loop.call_model(request_for(harness))
    assert "2 of its 2 requests per minute are in use" in raised.value.message


async def test_a_429_gives_its_reservation_back_and_a_timeout_keeps_it() -> None:
    model = Metered(latency_s=0.0, fail=ModelError("slow down", MODEL_RATE_LIMITED))
    harness = Harness(model)
    harness.plugin(TokenRateLimit(tokens_per_minute=250, wait=False))
    for _ in range(5):  # each 429 releases: never refused
        with pytest.raises(ModelError) as raised:
            await harness.loop.call_model(request_for(harness))
        assert not raised.value.refused
    model.fail = ModelError("gone", "MODEL_UNAVAILABLE")  # may have reached it: charged
    for _ in range(2):
        with pytest.raises(ModelError):
            await harness.loop.call_model(request_for(harness))
    with pytest.raises(ModelError) as raised:
        await harness.loop.call_model(request_for(harness))
    assert raised.value.refused


async def test_a_retry_outside_waits_out_the_refusal() -> None:
    model = Metered(latency_s=0.0)
    harness = Harness(model)
    harness.plugin(Retry(stage="model", attempts=2, max_backoff_ms=120_000, jitter=False))
    harness.plugin(TokenRateLimit(tokens_per_minute=150, wait=False))
    await aligned()
    await harness.loop.call_model(request_for(harness, used=(111, 0)))
    started = anyio.current_time()
    await harness.loop.call_model(request_for(harness))
    assert anyio.current_time() - started == pytest.approx(61.0)


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    model = Metered(latency_s=0.0)
    harness = Harness(model)
    harness.plugin(TokenRateLimit(tokens_per_minute=150))
    await aligned()
    await harness.loop.call_model(request_for(harness, used=(111, 0)))
    with anyio.move_on_after(5):
        await harness.loop.call_model(request_for(harness))
    started = anyio.current_time()
    await harness.loop.call_model(request_for(harness))  # not behind a ghost
    assert anyio.current_time() - started == pytest.approx(56.0)


async def test_a_higher_priority_waiter_goes_first() -> None:
    model = Metered(latency_s=0.0)
    harness = Harness(model)
    harness.plugin(TokenRateLimit(tokens_per_minute=120))
    await harness.loop.call_model(request_for(harness, used=(111, 0)))
    order: list[str] = []

    async def one(name: str, priority: int, after: float) -> None:
        await anyio.sleep(after)
        request = attrs.evolve(request_for(harness), priority=priority)
        await harness.loop.call_model(request)
        order.append(name)

    async with anyio.create_task_group() as group:
        group.start_soon(one, "batch", 0, 1.0)
        group.start_soon(one, "person", 5, 2.0)
    assert order == ["person", "batch"]


async def test_a_failing_store_lets_calls_through_by_default() -> None:
    class Down(MemoryStore):
        async def reserve(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("down")

    model = Metered(latency_s=0.0)
    harness = Harness(model, store=Down())
    harness.plugin(TokenRateLimit(tokens_per_minute=10))
    with pytest.warns(Warning, match="store failed"):
        await harness.loop.call_model(request_for(harness))
    assert len(model.calls) == 1


@attrs.frozen
class Call:
    at_s: float
    chars: int
    used: tuple[int, int]


calls_strategy = st.lists(
    st.builds(
        Call,
        st.integers(0, 3000).map(lambda n: n / 20),
        st.integers(0, 400),
        st.tuples(st.integers(0, 200), st.integers(0, 150)),
    ),
    min_size=1,
    max_size=30,
)


@given(calls=calls_strategy, limit=st.integers(200, 1500), wait=st.booleans())
@example(  # a call answered the instant two others reached the model (found on a fresh run)
    calls=[Call(1.8, 0, (0, 1)), Call(2.05, 0, (0, 101)), Call(2.05, 0, (0, 101))],
    limit=202,
    wait=True,
)
async def test_no_sliding_minute_admits_more_than_the_limit_and_one_estimates_error(
    calls: list[Call], limit: int, wait: bool
) -> None:
    """Property: in any sixty seconds, the tokens settled by the calls admitted then never
    pass the limit by more than what those calls used beyond their estimates (nothing,
    when every estimate is at least what its call used)."""
    model = Metered(latency_s=0.25)
    harness = Harness(model)
    harness.plugin(TokenRateLimit(tokens_per_minute=limit, wait=wait))
    admitted: list[tuple[float, int, int]] = []  # (when, used, estimate)
    start = anyio.current_time()

    async def one(call: Call) -> None:
        await anyio.sleep(call.at_s)
        estimate = call.chars // 4 + 1 + model.max_tokens
        try:
            with no_backoff():
                await harness.loop.call_model(request_for(harness, call.chars, call.used))
        except ModelError:
            return
        # when this call reached the model: it answers ``latency_s`` later, in virtual
        # time (``model.calls[-1]`` may be a call that started since)
        reached = anyio.current_time() - model.latency_s
        admitted.append((reached - start, sum(call.used), estimate))

    async with anyio.create_task_group() as group:
        for call in calls:
            group.start_soon(one, call)
    for when, _, _ in admitted:
        inside = [(used, estimate) for at, used, estimate in admitted if when - MINUTE < at <= when]
        error = sum(max(0, used - estimate) for used, estimate in inside)
        assert sum(used for used, _ in inside) <= limit + error
    if wait:  # nothing larger than the limit is refused when waiting
        assert len(admitted) == sum(1 for c in calls if c.chars // 4 + 101 <= limit)
