"""How each way a request ends is answered (``model_proxy/exchange.py``), read by the
official clients: an upstream that dies after the first byte reaches the client as the
API's own error event — never a clean end of a half answer — and is counted; the
proxy's own time rides on every answer; an error a retry cannot help says
``x-should-retry: false``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import serve
from tests.integrations.runaway import Runaway


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def runaway() -> Iterator[Runaway]:
    with Runaway(bound=0) as running:  # a text answer, in several events
        yield running


async def _anthropic(port: int) -> Any:
    from anthropic import AsyncAnthropic

    client = AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0)
    async with (
        client,
        client.messages.stream(
            model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as events,
    ):
        return await events.get_final_message()


async def _chat(port: int) -> Any:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    async with client:
        chunks: Any = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return [chunk async for chunk in chunks]


async def _responses(port: int) -> Any:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    async with client, client.responses.stream(model="m", input="hi") as events:
        return await events.get_final_response()


async def _gemini(port: int) -> Any:
    from google import genai
    from google.genai import types

    client = genai.Client(
        api_key="k", http_options=types.HttpOptions(base_url=f"http://127.0.0.1:{port}")
    )
    return [
        chunk
        async for chunk in await client.aio.models.generate_content_stream(
            model="gemini-x", contents="hi"
        )
    ]


CLIENTS = {"anthropic": _anthropic, "chat": _chat, "responses": _responses, "gemini": _gemini}
#: Where each wire's stream is cut: after its first content.
FIRST_CONTENT = {"anthropic": 3, "chat": 1, "responses": 4, "gemini": 1}


@pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
@pytest.mark.parametrize("api", sorted(CLIENTS))
async def test_an_upstream_that_dies_mid_answer_is_an_error_to_the_official_client(
    runaway: Runaway, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Reported elsewhere: a stream cut after its first byte ends as a clean 200 (no
    error, no fallback). Here the client raises or reports the error; it never gets a
    complete answer; the proxy counts the cut."""
    runaway.cut_after = FIRST_CONTENT[api]
    async for served in serve(Harness(), runaway):
        with pytest.raises(Exception) as raised:
            await CLIENTS[api](served.port)
        cuts = dict(served.proxy.cuts)
    if api == "responses":  # the SDK refuses a stream whose response failed
        assert "response.completed" in str(raised.value)
    else:
        assert "broke off mid-answer" in str(raised.value)
    wire = {"chat": "openai"}.get(api, api)
    assert cuts == {wire: 1}
    cut_lines = [r for r in caplog.records if r.name == "guardstack.decisions"]
    assert ['"stream_cut"' in r.getMessage() for r in cut_lines] == [True]


async def test_every_answer_says_the_proxys_own_time_and_a_useless_retry_is_said(
    runaway: Runaway,
) -> None:
    import httpx

    async for served in serve(Harness(), runaway, client_keys={"a-key": "t"}):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            answered = await raw.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": "Bearer a-key"},
            )
            refused = await raw.post(
                "/v1/chat/completions", json={"model": "m", "messages": []},
                headers={"authorization": "Bearer a-key"},
            )  # fmt: skip
            unknown = await raw.post("/v1/chat/completions", json={})
    overhead = float(answered.headers["x-guardstack-overhead-ms"])
    assert 0 <= overhead < 1_000
    assert refused.status_code == 400
    assert refused.headers["x-should-retry"] == "false"
    assert unknown.status_code == 401
    assert unknown.headers["x-should-retry"] == "false"
