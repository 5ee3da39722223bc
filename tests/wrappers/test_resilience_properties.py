"""Where each resilience layer sits is what it means, proved over random stacks and behaviour.

Each property runs the real layers, in virtual time on both backends, against a
small reference model that says from the order alone what must happen:

* a breaker outside a retry counts operations, inside it attempts — so it opens
  after a different number of tool runs, and refuses different later calls;
* time queued for a bulkhead slot counts against a budget only inside it;
* a fallback outside a retry is one more operation once every attempt failed
  (through the layers inside it, the retry included); inside, it answers each
  failed attempt;
* a hedge's winner is the first good answer, every other attempt has stopped
  when the call returns, and a non-idempotent tool is never run twice.
"""

from __future__ import annotations

from typing import Any

import anyio
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import TOOL_FAILED, TOOL_TIMEOUT, TOOL_UNAVAILABLE, Harness, ToolResult
from guardstack.pipeline.testing import Raise, Reply, ScriptedTool
from guardstack.wrappers import CircuitBreaker, ConcurrencyLimit, Fallback, Hedge, Retry, Timeout
from tests.helpers import call

ATTEMPTS = 3


# -- the breaker counts what it wraps ---------------------------------------------------


def breaker_reference(
    inside: bool, outcomes: list[bool], operations: int, minimum: int, ratio: float
) -> tuple[list[str | None], int]:
    """Each operation's final code and how many times the tool ran.

    ``outcomes`` says, run by run, whether the tool fails; it repeats its last."""
    runs = 0
    recorded: list[bool] = []
    opened = False

    def record(failed: bool) -> None:
        nonlocal opened
        recorded.append(failed)
        if len(recorded) >= minimum and sum(recorded) >= ratio * len(recorded):
            opened = True

    def tool() -> bool:
        nonlocal runs
        failed = outcomes[min(runs, len(outcomes) - 1)]
        runs += 1
        return failed

    codes: list[str | None] = []
    for _ in range(operations):
        if not inside:
            if opened:
                codes.append(TOOL_UNAVAILABLE)
                continue
            for attempt in range(1, ATTEMPTS + 1):
                failed = tool()
                if not failed or attempt == ATTEMPTS:
                    break
            record(failed)
            codes.append(TOOL_FAILED if failed else None)
            continue
        code: str | None = None
        for _ in range(ATTEMPTS):
            if opened:
                code = TOOL_UNAVAILABLE  # not retried: only TOOL_FAILED is
                break
            failed = tool()
            record(failed)
            code = TOOL_FAILED if failed else None
            if not failed:
                break
        codes.append(code)
    return codes, runs


@given(
    inside=st.booleans(),
    outcomes=st.lists(st.booleans(), min_size=1, max_size=12),
    operations=st.integers(1, 8),
    minimum=st.integers(1, 6),
    ratio=st.sampled_from([0.25, 0.5, 1.0]),
)
async def test_a_breaker_counts_operations_outside_a_retry_and_attempts_inside(
    inside: bool, outcomes: list[bool], operations: int, minimum: int, ratio: float
) -> None:
    tool = ScriptedTool("t", [Raise(RuntimeError("x")) if f else Reply("ok") for f in outcomes])
    built = Harness()
    tool.register(built.tools)
    breaker = CircuitBreaker(minimum_calls=minimum, failure_ratio=ratio, window_s=1e6, break_s=1e6)
    retry = Retry(attempts=ATTEMPTS, retry_on=(TOOL_FAILED,), backoff_ms=0)
    for layer in (retry, breaker) if inside else (breaker, retry):
        built.plugin(layer)
    codes = [(await built.tools.execute(call("t"))).result.code for _ in range(operations)]
    assert (codes, len(tool.runs)) == breaker_reference(
        inside, outcomes, operations, minimum, ratio
    )


# -- queue time and the budget --------------------------------------------------------------

EPSILON = 0.0001  # calls arrive this far apart, so their order is known


@given(
    inside=st.booleans(),
    durations=st.lists(st.integers(1, 20), min_size=2, max_size=6),
    slots=st.integers(1, 3),
    budget=st.integers(1, 30),
)
async def test_queue_time_counts_against_the_budget_only_inside_it(
    inside: bool, durations: list[int], slots: int, budget: int
) -> None:
    seconds = [d / 10 for d in durations]
    budget_ms = budget * 100 + 7  # never a tie with a duration: no race to decide
    budget_s = budget_ms / 1000
    tool = ScriptedTool("t", [Reply("ok", after_ms=s * 1000) for s in seconds])
    built = Harness()
    tool.register(built.tools)
    limit = ConcurrencyLimit(slots, queue=len(seconds))
    timeout = Timeout(ms=budget_ms)
    for layer in (timeout, limit) if inside else (limit, timeout):
        built.plugin(layer)
    start = anyio.current_time()
    ended: dict[int, tuple[float, str | None]] = {}

    async def one(index: int) -> None:
        await anyio.sleep(index * EPSILON)
        result = await built.tools.execute(call("t", {"i": index}))
        ended[index] = (anyio.current_time() - start, result.result.code)

    async with anyio.create_task_group() as group:
        for index in range(len(seconds)):
            group.start_soon(one, index)

    # The reference: FIFO slots; the n-th run of the tool takes the n-th duration.
    free = [0.0] * slots
    expected: dict[int, tuple[float, str | None]] = {}
    runs = 0
    for index in range(len(seconds)):
        arrival = index * EPSILON
        slot = min(range(slots), key=lambda s: free[s])
        granted = max(arrival, free[slot])
        deadline = arrival + budget_s if inside else granted + budget_s
        if granted >= deadline:  # inside only: the budget ran out in the queue
            expected[index] = (deadline, TOOL_TIMEOUT)
            continue
        duration = seconds[runs]
        runs += 1
        finish = min(granted + duration, deadline)
        free[slot] = finish
        expected[index] = (finish, TOOL_TIMEOUT if granted + duration > deadline else None)
    for index, (at, code) in expected.items():
        assert ended[index][1] == code, index
        assert ended[index][0] == pytest.approx(at, abs=1e-6), index
    assert len(tool.runs) == runs


# -- fallback once or per attempt -----------------------------------------------------------


@given(
    inside=st.booleans(),
    attempts=st.integers(1, 4),
    outcomes=st.lists(st.booleans(), min_size=1, max_size=6),
    fallback_fails=st.booleans(),
)
async def test_a_fallback_answers_once_outside_a_retry_and_after_each_attempt_inside(
    inside: bool, attempts: int, outcomes: list[bool], fallback_fails: bool
) -> None:
    answered: list[int] = []

    async def fallback(arguments: Any, call: Any) -> Any:
        answered.append(call.attempt)
        if fallback_fails:
            raise RuntimeError("the fallback failed too")
        return "from the fallback"

    tool = ScriptedTool("t", [Raise(RuntimeError("x")) if f else Reply("ok") for f in outcomes])
    built = Harness()
    tool.register(built.tools)
    retry = Retry(attempts=attempts, retry_on=(TOOL_FAILED,), backoff_ms=0)
    for layer in (retry, Fallback(fallback)) if inside else (Fallback(fallback), retry):
        built.plugin(layer)
    result = (await built.tools.execute(call("t"))).result

    runs = fallbacks = 0
    final: str = "ok"
    for _ in range(attempts):
        failed = outcomes[min(runs, len(outcomes) - 1)]
        runs += 1
        final = "x" if failed else "ok"
        if failed and inside:
            fallbacks += 1
            final = "fallback-failed" if fallback_fails else "from the fallback"
        if final in ("ok", "from the fallback"):
            break
    if not inside and final == "x":
        # one fallback operation, through the layers inside (the retry retries it too)
        fallbacks = attempts if fallback_fails else 1
        final = "fallback-failed" if fallback_fails else "from the fallback"
    assert len(tool.runs) == runs
    assert len(answered) == fallbacks
    expected = {"ok": "ok", "from the fallback": "from the fallback"}.get(final)
    if expected is None:
        assert result.code == TOOL_FAILED
    else:
        assert result.content == expected


# -- hedges ------------------------------------------------------------------------------------


@given(
    durations=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    delay=st.integers(1, 10),
    hedges=st.integers(1, 3),
    idempotent=st.sampled_from([None, True, False]),
)
async def test_the_first_good_answer_wins_and_no_hedge_outlives_the_call(
    durations: list[int], delay: int, hedges: int, idempotent: bool | None
) -> None:
    tool = ScriptedTool(
        "t", [Reply(f"run {n}", after_ms=(d / 10) * 1000) for n, d in enumerate(durations)]
    )
    built = Harness()
    built.tools.register(attrs.evolve(tool.definition, idempotent=idempotent))
    delay_ms = delay * 100 + 7  # never a tie between a start and an answer
    built.plugin(Hedge(delay_ms=delay_ms, max_hedges=hedges))
    start = anyio.current_time()
    result: ToolResult = (await built.tools.execute(call("t"))).result
    elapsed = anyio.current_time() - start

    assert all(run.ended is not None for run in tool.runs)  # nothing left running
    if idempotent is False:
        assert len(tool.runs) == 1
        assert result.content == "run 0"
        return
    # Attempt k starts at k * delay unless an earlier one has answered by then.
    finish: list[float] = []
    for k in range(hedges + 1):
        starts = k * delay_ms / 1000
        if finish and min(finish) <= starts:
            break
        finish.append(starts + durations[min(k, len(durations) - 1)] / 10)
    winner = min(range(len(finish)), key=lambda k: (finish[k], k))
    assert elapsed == pytest.approx(finish[winner])
    assert len(tool.runs) == len(finish)
    assert result.content == f"run {winner}"
    assert [run.outcome for run in tool.runs] == [
        "returned" if k == winner else "cancelled" for k in range(len(finish))
    ]


# -- state is bounded ----------------------------------------------------------------------------


async def test_many_agents_share_one_limit_without_losing_a_slot_or_starving() -> None:
    running = peak = done = 0

    async def work(arguments: Any, call: Any) -> str:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01 * (1 + arguments["i"] % 3))
        running -= 1
        done += 1
        return "ok"

    from guardstack.pipeline import ToolDefinition

    built = Harness()
    built.tools.register(ToolDefinition("t", work))
    built.plugin(ConcurrencyLimit(5, queue=1_000))
    async with anyio.create_task_group() as group:
        for index in range(500):
            group.start_soon(built.tools.execute, call("t", {"i": index}))  # type: ignore[arg-type]
    assert peak == 5
    assert done == 500
    assert running == 0


async def test_many_agents_share_one_breaker() -> None:
    tool = ScriptedTool("t", [Raise(RuntimeError("down"), after_ms=10)])
    built = Harness()
    tool.register(built.tools)
    built.plugin(CircuitBreaker(minimum_calls=20, failure_ratio=1.0, break_s=3600))
    codes: list[str | None] = []

    async def one() -> None:
        codes.append((await built.tools.execute(call("t"))).result.code)

    async with anyio.create_task_group() as group:
        for _ in range(100):
            group.start_soon(one)
    # all 100 were admitted before any finished; the 20th failure opened it
    assert codes.count(TOOL_FAILED) == 100
    assert (await built.tools.execute(call("t"))).result.code == TOOL_UNAVAILABLE


# -- deadline-aware retry -------------------------------------------------------------------------


@given(
    outer=st.integers(1, 60),
    budget=st.integers(1, 20),
    backoff=st.integers(0, 10),
    attempts=st.integers(1, 6),
)
async def test_a_deadline_aware_retry_starts_no_attempt_that_cannot_finish(
    outer: int, budget: int, backoff: int, attempts: int
) -> None:
    from guardstack.pipeline import ToolDefinition

    runs: list[tuple[float, float | None]] = []

    async def hang(arguments: Any, call: Any) -> str:
        runs.append((anyio.current_time(), None))
        await anyio.sleep(3600)
        return "never"

    built = Harness()
    built.tools.register(ToolDefinition("t", hang, timeout_ms=budget * 100))
    built.plugin(Timeout(ms=outer * 100 + 7, code="TOTAL"))
    built.plugin(
        Retry(attempts=attempts, backoff_ms=backoff * 100, jitter=False, respect_deadline=True)
    )
    built.plugin(Timeout())  # each attempt: the tool's budget
    start = anyio.current_time()
    result = (await built.tools.execute(call("t"))).result
    deadline = start + (outer * 100 + 7) / 1000
    # every retried attempt could finish (its budget) before the outer deadline …
    assert all(started + budget / 10 < deadline for started, _ in runs[1:])
    # … so the outer deadline can only cut the first attempt
    if result.code == "TOTAL":
        assert len(runs) == 1
    else:
        assert result.code == TOOL_TIMEOUT
        assert anyio.current_time() < deadline
        if len(runs) < attempts:
            assert "not retried" in result.content  # it says why it stopped
