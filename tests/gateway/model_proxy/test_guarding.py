"""A conversation's guards behind the proxy (``model_proxy/guarding.py``): a client's
resends are attempts of one operation — a model-stage ``retry {attempts: N}`` makes at
most N upstream calls for a request however often the client sends it — and a turn in
which no upstream call worked ends as the upstream's error, never as a cap's stop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.guards import ModelCallLimit
from guardstack.pipeline import Harness
from guardstack.wrappers import Retry
from tests.gateway.model_proxy.test_app import serve
from tests.integrations.runaway import Runaway

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hello."}]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def runaway() -> Iterator[Runaway]:
    with Runaway(bound=0) as running:
        yield running


async def test_resends_of_a_failed_request_are_attempts_of_one_operation(
    runaway: Runaway,
) -> None:
    """Reported: with ``retry {attempts: 2}`` and an overloaded upstream, Claude Code's
    own retries made 9 client requests 18 upstream requests. Now five sends of one
    request make two upstream calls; each send is answered the upstream's error; once
    the upstream answers, the same request later is a new operation."""
    runaway.fail = 503
    harness = Harness()
    harness.plugin(Retry(stage="model", attempts=2, backoff_ms=1, retry_on=["MODEL_UNAVAILABLE"]))
    async for served in serve(harness, runaway):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            answers = [await raw.post("/v1/chat/completions", json=BODY) for _ in range(5)]
            asked_while_failing = len(runaway.model_requests())
            runaway.fail = None
            # the client keeps the history: the next send is still this operation's...
            exhausted = await raw.post("/v1/chat/completions", json=BODY)
            other = {**BODY, "messages": [{"role": "user", "content": "Another."}]}
            fresh = await raw.post("/v1/chat/completions", json=other)
    assert [answer.status_code for answer in answers] == [503] * 5
    assert all(answer.json()["error"]["message"] == "down" for answer in answers)
    assert asked_while_failing == 2
    assert exhausted.status_code == 503  # ...whose attempts are used: not sent again
    assert fresh.status_code == 200


async def test_a_turn_in_which_nothing_worked_ends_as_the_upstreams_error(
    runaway: Runaway,
) -> None:
    """Reported: with every request failing, Codex was told ``Stopped by
    model-call-limit`` and exited 0 ("the agent looped"); the cap's stop is now the
    upstream's own error while no call of the turn has worked."""
    runaway.fail = 500
    harness = Harness()
    harness.plugin(ModelCallLimit(per_turn=2))
    async for served in serve(harness, runaway):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            answers = [
                await raw.post(
                    "/v1/chat/completions", json=BODY, headers={"x-stainless-retry-count": "1"}
                )
                for _ in range(4)
            ]
            runaway.fail = None
            later = {**BODY, "messages": [*BODY["messages"],
                                          {"role": "assistant", "content": "Hi."},
                                          {"role": "user", "content": "Again."}]}  # fmt: skip
            worked = await raw.post("/v1/chat/completions", json=later)
    assert [answer.status_code for answer in answers] == [500] * 4
    assert not any("x-guardstack-stopped" in answer.headers for answer in answers)
    assert worked.status_code == 200  # a new turn: its own count


@settings(max_examples=15, deadline=None)
@given(wires=st.lists(st.sampled_from(["chat", "responses"]), min_size=1, max_size=6))
def test_a_request_on_one_wire_is_never_a_resend_of_a_failed_one_on_another(
    wires: list[str],
) -> None:
    """Reported (#66): after a chat request failed upstream, a Responses request with the
    same key and prompt was answered with the chat call's error without going upstream
    (resends were keyed by history only). Any interleaving of the two wires, the
    upstream failing: each wire's first request goes upstream; a wire's resend (with no
    ``Retry``, one attempt an operation) is answered with its own last error."""
    import httpx

    from guardstack.gateway.model_proxy import ModelProxy
    from tests.integrations.runaway import Runaway

    bodies = {
        "chat": ("/v1/chat/completions",
                 {"model": "m", "messages": [{"role": "user", "content": "Fix it."}]}),
        "responses": ("/v1/responses", {"model": "m", "input": "Fix it."}),
    }  # fmt: skip

    async def drive(upstream: Runaway) -> list[int]:
        proxy = ModelProxy(Harness(), upstream.url)
        transport = httpx.ASGITransport(app=proxy.app)
        statuses = []
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as raw:
            for wire in wires:
                path, body = bodies[wire]
                answer = await raw.post(path, json=body, headers={"authorization": "Bearer k"})
                statuses.append(answer.status_code)
        await proxy.aclose()
        return statuses

    with Runaway(bound=0) as upstream:
        upstream.fail = 500
        statuses = anyio.run(drive, upstream)
    reached = [seen.path for seen in upstream.model_requests()]
    assert reached == [bodies[w][0] for w in dict.fromkeys(wires)]  # each wire's first only
    assert set(statuses) == {500}  # every answer is its own wire's upstream error
