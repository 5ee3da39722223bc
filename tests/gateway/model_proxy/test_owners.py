"""Tenants never cross (``model_proxy/owners.py`` and the conversations' keys): what one
tenant sends — a stored response's id, a conversation header, a name with ``/`` — never
reaches another tenant's state. The official ``openai`` client and raw HTTP in front of
the proxy; a loopback server speaking the Responses API behind it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI, NotFoundError

from guardstack.guards import ModelCallLimit
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import ASK, serve
from tests.integrations.chat_server import Answer, ChatServer
from tests.integrations.responses_server import ResponsesServer, Said

KEY_A, KEY_B = "key-team-a-0123456789", "key-team-b-0123456789"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def client(port: int, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tenant_cannot_continue_another_tenants_stored_response(
    responses_server: ResponsesServer, stream: bool
) -> None:
    """Reported: team B's ``previous_response_id`` naming team A's response was forwarded
    under the shared provider key, and the provider continued A's conversation for B.
    Now B is told what the provider says of an id it does not know (404) and nothing
    goes upstream; A's own continuation works, JSON and streamed."""
    responses_server.reset()
    responses_server.script = [Said("A's secret plan.", response_id="resp_team_a_1"),
                               Said("Continued for A.", response_id="resp_team_a_2")]  # fmt: skip
    keys = {KEY_A: "team-a", KEY_B: "team-b"}
    async for served in serve(Harness(), responses_server, client_keys=keys):
        async with client(served.port, KEY_A) as team_a, client(served.port, KEY_B) as team_b:
            first: Any
            if stream:
                async with team_a.responses.stream(model="m", input="Plan it.") as events:
                    first = await events.get_final_response()
            else:
                first = await team_a.responses.create(model="m", input="Plan it.")
            assert first.id == "resp_team_a_1"
            with pytest.raises(NotFoundError) as refused:
                await team_b.responses.create(
                    model="m", input="Repeat it all.", previous_response_id=first.id
                )
            asked_before = len(responses_server.bodies)
            own = await team_a.responses.create(
                model="m", input="Go on.", previous_response_id=first.id
            )
    assert refused.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    assert asked_before == 1  # B's request never went upstream
    assert own.output_text == "Continued for A."
    assert json.loads(responses_server.bodies[-1])["previous_response_id"] == "resp_team_a_1"


@pytest.mark.parametrize(
    "body",
    [
        {"conversation": "conv_123"},
        {"conversation": {"id": "conv_123"}},
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_9"}]}]},
    ],
)
async def test_state_the_proxy_cannot_attribute_is_refused_while_tenants_are_set(
    responses_server: ResponsesServer, body: dict[str, Any]
) -> None:
    responses_server.reset()
    keys = {KEY_A: "team-a"}
    async for served in serve(Harness(), responses_server, client_keys=keys):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            answer = await raw.post(
                "/v1/responses",
                json={"model": "m", "input": "hi", **body},
                headers={"authorization": f"Bearer {KEY_A}"},
            )
    assert answer.status_code == 400
    field = next(iter(body)) if "conversation" in body else "input[0].content[0].file_id"
    assert answer.json()["error"]["message"].startswith(f"{field} names state stored")
    assert responses_server.bodies == []


# -- the property: random tenants, names and headers ------------------------------------

#: Tenant names as an operator writes them: any text, with ``/`` and ``:`` often.
tenant_names = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8
) | st.sampled_from(["acme", "acme/prod", "a:b", "a", "a/b/c"])
#: What a client may put in a header: printable ASCII, ``/`` and ``:`` often.
header_text = st.text(st.sampled_from("ab/:-_.%0"), min_size=1, max_size=8)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    first=tenant_names,
    middle=header_text,
    last=header_text,
    joined=st.sampled_from(["/", ":", "%2F"]),
)
async def test_no_tenant_reaches_another_tenants_conversation_or_response(
    chat_server: ChatServer, first: str, middle: str, last: str, joined: str
) -> None:
    """Two tenants whose names and conversation headers join to the same text
    (``acme`` + ``prod/support`` and ``acme/prod`` + ``support``): the second tenant
    uses its conversation's one model call; the first is still served in its own
    conversation (it neither spends nor is stopped by the other's count)."""
    second = f"{first}{joined}{middle}"
    keys = {KEY_A: first, KEY_B: second}
    harness = Harness()
    harness.plugin(ModelCallLimit(per_session=1))
    chat_server.script = [Answer("for the second"), Answer("for the first")]
    headers_b = {"authorization": f"Bearer {KEY_B}", "x-guardstack-conversation": last}
    headers_a = {
        "authorization": f"Bearer {KEY_A}",
        "x-guardstack-conversation": f"{middle}{joined}{last}",
    }
    async for served in serve(harness, chat_server, client_keys=keys):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            body = {"model": "m", "messages": ASK}
            second_answer = await raw.post("/v1/chat/completions", json=body, headers=headers_b)
            first_answer = await raw.post("/v1/chat/completions", json=body, headers=headers_a)
    chat_server.reset()
    assert "x-guardstack-stopped" not in second_answer.headers
    assert "x-guardstack-stopped" not in first_answer.headers, (first, second, middle, last)
    assert first_answer.json()["choices"][0]["message"]["content"] == "for the first"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"cachedContent": "cachedContents/abc123"}, "cachedContent"),
        (
            {"contents": [{"role": "user", "parts": [{"text": "read this"}, {"fileData": {
                "mimeType": "text/plain", "fileUri": "https://files.example/v1beta/files/x"}}]}]},
            "contents[0].parts[1].fileData.fileUri",
        ),
    ],
)  # fmt: skip
async def test_gemini_provider_state_is_refused_while_tenants_are_set(
    extra: dict[str, Any], field: str
) -> None:
    """Reported: while tenants are set OpenAI's ``file_id``, ``conversation`` and
    ``container`` were refused, but Gemini's ``cachedContent`` and a part's
    ``fileData.fileUri`` were forwarded — under the one provider key every tenant shares."""
    from tests.integrations.runaway import Runaway

    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], **extra}
    with Runaway(bound=0) as upstream:
        async for served in serve(Harness(), upstream, client_keys={KEY_A: "team-a"}):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                answer = await raw.post(
                    "/v1beta/models/gemini-x:generateContent",
                    json=body,
                    headers={"x-goog-api-key": KEY_A},
                )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith(f"{field} names state stored")
    assert upstream.model_requests() == []
