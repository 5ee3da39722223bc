"""The Gemini API through the proxy (``model_proxy/gemini.py``): Google's own client on one
side, a loopback server speaking the Gemini API on the other — the client key in
``x-goog-api-key`` or ``?key=`` and never forwarded, ``usageMetadata`` charged, a
reminder added as a text part, errors in the Gemini API's own shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from guardstack.guards import RepeatToolReminder, UsageLimit
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import serve
from tests.integrations.runaway import Runaway

KEY = "a-gemini-client-key-0123"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def runaway() -> Iterator[Runaway]:
    with Runaway(bound=3, tool="run", arguments={"command": "ls"}, usage=(120, 30)) as up:
        yield up


@pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
async def test_googles_client_is_guarded_and_charged_and_its_key_never_leaves(
    runaway: Runaway,
) -> None:
    from google import genai
    from google.genai import types

    harness = Harness()
    harness.plugin(RepeatToolReminder(thresholds=(2,)))
    harness.plugin(UsageLimit(tokens_per_day=1_000_000, tenant="t"))
    async for served in serve(harness, runaway, client_keys={KEY: "team"}):
        client = genai.Client(
            api_key=KEY, http_options=types.HttpOptions(base_url=f"http://127.0.0.1:{served.port}")
        )
        declaration = types.FunctionDeclaration(name="run", parameters_json_schema={})
        config = types.GenerateContentConfig(
            tools=[types.Tool(function_declarations=[declaration])]
        )
        contents: list[Any] = [types.Content(role="user", parts=[types.Part(text="ls")])]
        for _ in range(3):
            answer = await client.aio.models.generate_content(
                model="gemini-x", contents=contents, config=config
            )
            calls = answer.function_calls or []
            if not calls:
                break
            contents += [
                answer.candidates[0].content,  # type: ignore[index]
                types.Content(role="user", parts=[types.Part.from_function_response(
                    name="run", response={"output": "a.py"})]),
            ]  # fmt: skip
    assert all(seen.headers.get("x-goog-api-key") != KEY for seen in runaway.requests)
    assert all(seen.path.startswith("/v1beta/models/gemini-x:") for seen in runaway.requests)
    reminded = [
        part.get("text", "")
        for seen in runaway.model_requests()
        for part in seen.body["contents"][-1]["parts"]
        if "text" in part
    ]
    assert any("repeating the exact same tool call" in text for text in reminded)


async def test_the_key_may_come_in_the_query_and_errors_are_the_apis_own(
    runaway: Runaway,
) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    async for served in serve(Harness(), runaway, client_keys={KEY: "team"}):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            by_query = await raw.post(f"/v1beta/models/gemini-x:generateContent?key={KEY}",
                                      json=body)  # fmt: skip
            streamed = await raw.post(
                "/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
                json=body,
                headers={"x-goog-api-key": KEY},
            )
            no_key = await raw.post("/v1beta/models/gemini-x:generateContent", json=body)
            malformed = await raw.post(
                "/v1beta/models/gemini-x:generateContent",
                json={"contents": [{"parts": [{"text": 5}]}]},
                headers={"x-goog-api-key": KEY},
            )
            unknown = await raw.post(
                "/v1beta/models/gemini-x:embedContent", json=body, headers={"x-goog-api-key": KEY}
            )
    assert by_query.status_code == 200
    assert by_query.json()["usageMetadata"]["promptTokenCount"] == 120
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert '"finishReason": "STOP"' in streamed.text
    assert "key=" not in runaway.requests[0].path  # the client's key stays here
    assert no_key.status_code == 401
    assert no_key.json()["error"]["status"] == "UNAUTHENTICATED"
    assert malformed.status_code == 400
    assert malformed.json()["error"] == {
        "code": 400,
        "message": "contents[0].parts[0].text must be text",
        "status": "INVALID_ARGUMENT",
    }
    assert unknown.status_code == 404
