"""One request, one value (``gateway/model_proxy/request.py``): who asked, what it will
cost and where it goes are decided once, as it arrives, and every step reads them.

* every decision-log line of a request — streamed or JSON, on every wire, a guard's
  stop and a budget's alert made while the stream is relayed included — names its
  tenant, team, key and conversation;
* each wire estimates what its requests carry (system prompts, instructions, parts,
  tool definitions; ``n`` and ``candidateCount``), so requests at once never pass a
  token or a dollar budget;
* a key's id is ``TENANT/NAME``: two tenants' ``alice`` never meet.

Against a loopback upstream speaking every wire (``tests/integrations/runaway.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guardstack.gateway.decision_log import DecisionLog
from guardstack.gateway.tenants import tenants_of
from guardstack.guards import UsageLimit
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import serve
from tests.integrations.runaway import Runaway

ADMIN = "an-admin-key-of-some-length"
KEY = "sk-acme-ci-bot-0123456789"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def request_for(wire: str, text: str, *, stream: bool, system: str = "", more: int = 1) -> tuple[
    str, dict[str, Any]
]:  # fmt: skip
    """A request on ``wire`` saying ``text`` after a system prompt ``system``, asking for
    ``more`` answers where the wire can: (path, body)."""
    user: Any = [{"role": "user", "content": text}]
    if wire == "chat":
        messages = [{"role": "system", "content": system}, *user] if system else user
        body = {"model": "m", "messages": messages, "max_tokens": 50, "n": more, "stream": stream}
        return "/v1/chat/completions", body
    if wire == "responses":
        body = {"model": "m", "input": text, "instructions": system, "max_output_tokens": 50,
                "stream": stream}  # fmt: skip
        return "/v1/responses", body
    if wire == "messages":
        body = {"model": "m", "messages": user, "system": system, "max_tokens": 50,
                "stream": stream}  # fmt: skip
        return "/v1/messages", body
    body = {
        "contents": [{"role": "user", "parts": [{"text": text}]}],
        "systemInstruction": {"parts": [{"text": system}]},
        "generationConfig": {"maxOutputTokens": 50, "candidateCount": more},
    }
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/v1beta/models/m:{action}", body


def auth(wire: str, key: str) -> dict[str, str]:
    if wire == "gemini":
        return {"x-goog-api-key": key}
    if wire == "messages":
        return {"x-api-key": key}
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def decisions() -> Iterator[DecisionLog]:
    log = DecisionLog("off").attach()
    try:
        yield log
    finally:
        log.detach()


WIRES = ["chat", "responses", "messages", "gemini"]


async def alerted(decisions: DecisionLog) -> None:
    while not any(line["event"] == "budget_alert" for line in decisions.recent):  # noqa: ASYNC110
        await anyio.sleep(0.01)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_every_decision_line_of_a_request_names_who_asked(
    wire: str, stream: bool, decisions: DecisionLog
) -> None:
    """A budget's alert (made as the answer settles — for a stream, after the route's
    handler returned) and a guard's stop, on every wire: none with a null tenant,
    team, key or conversation."""
    tenants = tenants_of(
        {
            "keys": {KEY: {"tenant": "acme", "team": "ci", "name": "bot"}},
            "tenants": {"acme": {"teams": {"ci": {"budget": {"usd_per_day": 10,
                                                              "alert_at": 0.00001}}}}},
            "prices": {"m": [10, 30]},
        }
    )  # fmt: skip
    harness = Harness()
    harness.plugin(UsageLimit(tokens_per_day=70))  # the first fits, the second is stopped
    with Runaway(bound=0, usage=(10, 20)) as upstream:
        async for served in serve(harness, upstream, tenants=tenants):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                for _ in range(2):  # the second is the cap's stop
                    path, body = request_for(wire, "hello", stream=stream)
                    answer = await raw.post(path, json=body, headers=auth(wire, KEY))
                    assert answer.status_code == 200, answer.text
            with anyio.fail_after(5):
                await alerted(decisions)  # the settle may run after the reply went out
    lines = list(decisions.recent)
    events = {line["event"] for line in lines}
    assert {"budget_alert", "stop"} <= events, lines
    for line in lines:
        who = (line["tenant"], line["team"], line["key_name"], line["conversation"])
        assert None not in who, line
        assert who[:3] == ("acme", "ci", "acme/bot"), line


@pytest.mark.parametrize("wire", WIRES)
async def test_requests_at_once_never_pass_a_token_budget_on_any_wire(wire: str) -> None:
    """Three requests of about 10,000 tokens each — most of it the system prompt (or
    instructions, or systemInstruction) — at once under a 25,000-token day: each is
    estimated at least its cost, so they never spend past it. (Reported: every Gemini
    prompt was estimated at one token; three at once spent 30,300 of 20,000.)"""
    prompt = "word " * 8_000  # 40,000 characters: about 10,000 tokens
    tenants = tenants_of(
        {
            "keys": {KEY: {"tenant": "acme", "name": "bot"}},
            "tenants": {"acme": {"budget": {"tokens_per_day": 25_000}}},
        }
    )
    with Runaway(bound=0, usage=(10_050, 50)) as upstream:
        async for served in serve(Harness(), upstream, tenants=tenants, admin_key=ADMIN):
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{served.port}", timeout=30
            ) as raw:
                statuses: list[int] = []

                async def one(n: int, statuses: list[int] = statuses) -> None:
                    path, body = request_for(wire, f"task {n}", stream=False, system=prompt)
                    answer = await raw.post(path, json=body, headers=auth(wire, KEY))
                    statuses.append(answer.status_code)

                async with anyio.create_task_group() as group:
                    for n in range(3):
                        group.start_soon(one, n)
                spent = await raw.get(
                    "/admin/spend",
                    params={"scope": "tenant:acme"},
                    headers={"authorization": f"Bearer {ADMIN}"},
                )
    granted = len(upstream.model_requests())
    assert granted * 10_100 <= 25_000  # never over: at most two of the three went upstream
    assert granted >= 1
    assert spent.json()["rows"][0]["tokens"] <= 25_000
    assert statuses.count(200) == 3  # the refused one is the budget's stop, answered


@pytest.mark.parametrize("wire", ["chat", "gemini"])
async def test_every_answer_a_request_asks_for_is_reserved(wire: str) -> None:
    """``n`` and ``candidateCount`` answers may each use the whole output limit: a
    request for 8 answers of 50 tokens reserves 400 and is refused under 300."""
    tenants = tenants_of(
        {
            "keys": {KEY: {"tenant": "acme", "name": "bot"}},
            "tenants": {"acme": {"budget": {"tokens_per_day": 300}}},
        }
    )
    with Runaway(bound=0, usage=(5, 50)) as upstream:
        async for served in serve(Harness(), upstream, tenants=tenants):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                path, body = request_for(wire, "hi", stream=False, more=8)
                many = await raw.post(path, json=body, headers=auth(wire, KEY))
                path, body = request_for(wire, "hi", stream=False, more=1)
                one = await raw.post(path, json=body, headers=auth(wire, KEY))
    assert many.headers.get("x-guardstack-stopped") == "budgets"
    assert one.headers.get("x-guardstack-stopped") is None
    assert len(upstream.model_requests()) == 1


NAMES = st.sampled_from(["alice", "bob", "ci"])


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    keys=st.lists(
        st.tuples(st.sampled_from(["acme", "globex"]), NAMES), min_size=2, max_size=5, unique=True
    ),
    target=st.integers(0, 10),
    action=st.sampled_from(["revoke", "cap", "report"]),
)
def test_what_is_done_to_one_key_never_touches_another_tenants_key_of_that_name(
    keys: list[tuple[str, str]], target: int, action: str
) -> None:
    """Random tenants files where names collide across tenants: revoking, capping or
    reporting one key by its id never touches another's."""
    secrets = {f"sk-{tenant}-{name}-0123456789ab": (tenant, name) for tenant, name in keys}
    chosen_secret = list(secrets)[target % len(secrets)]
    chosen = "/".join(secrets[chosen_secret])
    tenants = tenants_of(
        {
            "keys": {k: {"tenant": t, "name": n} for k, (t, n) in secrets.items()},
            "tenants": {"acme": {}, "globex": {}},
            "prices": {"m": [10, 30]},
        }
    )
    admin = {"authorization": f"Bearer {ADMIN}"}

    async def drive() -> dict[str, int]:
        with Runaway(bound=0, usage=(5, 50)) as upstream:
            async for served in serve(Harness(), upstream, tenants=tenants, admin_key=ADMIN):
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                    for secret in secrets:  # one request each: every key has spent
                        path, body = request_for("chat", "hi", stream=False)
                        await raw.post(path, json=body, headers=auth("chat", secret))
                    if action == "revoke":
                        done = await raw.delete(f"/admin/keys/{chosen}", headers=admin)
                    elif action == "cap":
                        done = await raw.put(
                            f"/admin/budgets/key:{chosen}", json={"usd_per_day": 0}, headers=admin
                        )
                    else:
                        done = await raw.get(
                            "/admin/spend", params={"scope": f"key:{chosen}"}, headers=admin
                        )
                        assert done.json()["rows"][0]["requests"] == 1  # its own, alone
                    assert done.status_code == 200, done.text
                    statuses = {}
                    for secret in secrets:
                        path, body = request_for("chat", "again", stream=False)
                        answer = await raw.post(path, json=body, headers=auth("chat", secret))
                        stopped = answer.headers.get("x-guardstack-stopped")
                        statuses["/".join(secrets[secret])] = (
                            answer.status_code if stopped is None else 0
                        )
        return statuses

    statuses = anyio.run(drive)
    for key_id, status in statuses.items():
        if key_id == chosen and action == "revoke":
            assert status == 401
        elif key_id == chosen and action == "cap":
            assert status == 0  # the budget's stop
        else:
            assert status == 200, (key_id, statuses)


async def test_behind_the_proxy_guard_decisions_are_guardrail_events(chat_server: Any) -> None:
    """The conversation's guards behind the model proxy: the reminder and the cap's stop
    are ``gen_ai.guardrail.result`` events on the spans of the calls they are about."""
    from guardstack.guards import RepeatToolReminder, ToolCallLimit
    from guardstack.pipeline.decisions import GUARDRAIL_EVENT
    from guardstack.wrappers import Tracing
    from tests.integrations.chat_server import Answer
    from tests.wrappers.otel import SpanRig

    rig = SpanRig()
    harness = Harness()
    harness.plugin(Tracing(rig.provider))
    harness.plugin(RepeatToolReminder())
    harness.plugin(ToolCallLimit(per_turn=4))
    chat_server.script = [
        Answer(None, tool_calls=((f"c{n}", "grep", '{"q": "TODO"}'),)) for n in range(10)
    ]
    messages: list[Any] = [{"role": "user", "content": "What is in the repo?"}]
    async for served in serve(harness, chat_server):
        async with served.client() as client:
            for _ in range(8):
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=messages
                )
                choice = raw.parse().choices[0]
                if choice.finish_reason == "stop":
                    break
                [call] = choice.message.tool_calls or []
                messages.append(choice.message.model_dump(exclude_none=True))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.py"})
    events = [
        (dict(event.attributes or {}), span.name)
        for span in rig.spans
        for event in span.events
        if event.name == GUARDRAIL_EVENT
    ]
    decisions = {(e["gen_ai.guardrail.component.name"], e["gen_ai.guardrail.result.value"])
                 for e, _ in events}  # fmt: skip
    assert ("repeat-tool-reminder", "remind") in decisions, [s.name for s in rig.spans]
    assert any(layer == "tool-call-limit" for layer, _ in decisions), decisions
    assert "TODO" not in repr(events)  # never a tool's arguments
