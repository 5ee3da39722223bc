"""The model proxy held to what a gateway is held to — one test per defect a hostile
suite found (each failed before): spend that escaped, others who got in, bad input that
was a 500, what was unbounded, half a model stage, the API it did not speak. The
official ``openai`` and ``anthropic`` clients and raw HTTP on one side; loopback
servers speaking each provider's wire protocol on the other (real time, asyncio)."""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guardstack.guards import BudgetNotice, ModelCallLimit, RepeatToolReminder, UsageLimit
from guardstack.pipeline import Harness, MemoryStore
from guardstack.pipeline.contract import Window, store_key
from tests.gateway.model_proxy.test_app import ASK, Served, serve
from tests.integrations.chat_server import Answer, ChatServer, Raw
from tests.integrations.responses_server import ResponsesServer, Said


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def today() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")


async def one(served: Served, path: str, body: Any, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as client:
        if isinstance(body, bytes):
            return await client.post(path, content=body, headers=headers)
        return await client.post(path, json=body, headers=headers)


# -- spend that escaped -----------------------------------------------------------------


async def test_a_stream_that_asks_no_usage_is_charged_like_json(chat_server: ChatServer) -> None:
    """Reported: the JSON path stopped at 120 of 100 tokens; 8 streamed calls passed."""
    harness = Harness()
    harness.plugin(UsageLimit(tokens_per_day=100, tenant="t", estimate_output_tokens=1))
    chat_server.script = [Answer("An answer.", usage=(30, 30))] * 8
    stopped = 0
    async for served in serve(harness, chat_server):
        async with served.client() as client:
            for _ in range(8):
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=ASK, stream=True
                )
                stopped += raw.headers.get("x-guardstack-stopped") == "usage-limit"
                async for _ in raw.parse():
                    pass
    assert len(chat_server.bodies) == 2  # 60 each: a third would pass 100
    assert stopped == 6
    for body in chat_server.bodies:  # usage was asked of the upstream on every stream
        assert json.loads(body)["stream_options"] == {"include_usage": True}


async def test_the_usage_chunk_the_client_did_not_ask_for_is_stripped(
    chat_server: ChatServer,
) -> None:
    chat_server.script = [Answer("Hello there."), Answer("Hello there.")]
    async for served in serve(Harness(), chat_server):
        async with served.client() as client:
            plain: Any = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            chunks = [chunk async for chunk in plain]
            asked: Any = await client.chat.completions.create(
                model="m", messages=ASK, stream=True, stream_options={"include_usage": True}
            )
            with_usage = [chunk async for chunk in asked]
    assert all(chunk.usage is None for chunk in chunks)  # as the client asked: none
    assert all(chunk.choices for chunk in chunks)
    assert with_usage[-1].usage is not None  # asked for: passed through


async def test_a_priced_day_prices_each_request_at_its_own_model(chat_server: ChatServer) -> None:
    """Reported: usd_per_day with prices made every request a 500 (no price for None)."""
    harness = Harness()
    harness.load(
        [
            {
                "name": "usage-limit",
                "config": {"usd_per_day": 1.0, "prices": {"gpt-x": [1.0, 2.0]}},
            }
        ]
    )
    chat_server.script = [Answer("Priced.", model="gpt-x")]
    async for served in serve(harness, chat_server):
        async with served.client() as client:
            reply = await client.chat.completions.create(model="gpt-x", messages=ASK)
    assert reply.choices[0].message.content == "Priced."


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": None, "completion_tokens": 5},
        {"prompt_tokens": -3, "completion_tokens": 5},
        {"prompt_tokens": 1e999, "completion_tokens": 5},
        {"prompt_tokens": 10**400, "completion_tokens": 5},
        None,
    ],
    ids=["null", "negative", "infinite", "huge", "absent"],
)
async def test_usage_the_proxy_cannot_count_passes_through_and_is_charged_unknown(
    chat_server: ChatServer, usage: Any
) -> None:
    reply = {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": usage,
    }
    body = json.dumps(reply).replace("Infinity", "1e999")
    store = MemoryStore()
    harness = Harness(store=store)
    harness.plugin(UsageLimit(tokens_per_day=10_000, tenant="t", estimate_output_tokens=500))
    chat_server.script = [Raw(body)]
    async for served in serve(harness, chat_server):
        answer = await one(served, "/v1/chat/completions", {"model": "m", "messages": ASK})
    assert answer.status_code == 200
    assert answer.content == body.encode()  # passthrough is exact
    day = Window(store_key("usage-limit", "tenant", "t", "tokens", f"day:{today()}"), "tokens")
    assert await store.balance(day) > 500  # charged its reservation, not 0


async def test_a_reply_whose_message_is_null_passes_through(chat_server: ChatServer) -> None:
    body = json.dumps({"id": "x", "choices": [{"index": 0, "message": None}], "usage": None})
    chat_server.script = [Raw(body)]
    async for served in serve(Harness(), chat_server):
        answer = await one(served, "/v1/chat/completions", {"model": "m", "messages": ASK})
    assert (answer.status_code, answer.content) == (200, body.encode())


# -- others who got in ------------------------------------------------------------------


async def test_every_route_needs_a_known_key_and_the_scheme_is_any_case(
    chat_server: ChatServer,
) -> None:
    chat_server.script = [Answer("ok")]
    async for served in serve(Harness(), chat_server, client_keys={"k-a": "team-a"}):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as client:
            models = await client.get("/v1/models")
            lower = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": ASK},
                headers={"authorization": "bearer k-a"},
            )
    assert models.status_code == 401  # reported: listed the upstream's models to anyone
    assert models.json()["error"]["code"] == "invalid_api_key"
    assert lower.status_code == 200  # reported: a lower-case scheme was refused


async def test_a_conversation_is_the_tenants_own(chat_server: ChatServer) -> None:
    """Reported: team-b, naming team-a's conversation, used up its session cap."""
    harness = Harness()
    harness.plugin(ModelCallLimit(per_session=1))
    chat_server.script = [Answer("for a"), Answer("for b")]
    keys = {"k-a": "team-a", "k-b": "team-b"}
    async for served in serve(harness, chat_server, client_keys=keys):
        shared = {"x-guardstack-conversation": "c-1"}
        body = {"model": "m", "messages": ASK}
        first = await one(served, "/v1/chat/completions", body, authorization="Bearer k-a",
                          **shared)  # fmt: skip
        other = await one(served, "/v1/chat/completions", body, authorization="Bearer k-b",
                          **shared)  # fmt: skip
    assert first.json()["choices"][0]["message"]["content"] == "for a"
    assert other.json()["choices"][0]["message"]["content"] == "for b"  # its own session


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"content-type": "text/plain"}, 415),
        ({"content-type": "application/json", "origin": "https://evil.example"}, 403),
        ({"content-type": "application/json", "host": "evil.example"}, 403),
        ({"content-type": "application/json", "host": "evil.example:8809"}, 403),
    ],
    ids=["text-plain", "foreign-origin", "rebound-host", "rebound-host-port"],
)
async def test_a_browser_it_does_not_know_never_reaches_the_upstream(
    chat_server: ChatServer, headers: dict[str, str], status: int
) -> None:
    """Reported: a text/plain POST from evil.example was forwarded with the upstream key."""
    async for served in serve(Harness(), chat_server):
        body = json.dumps({"model": "m", "messages": ASK}).encode()
        answer = await one(served, "/v1/chat/completions", body, **headers)
    assert answer.status_code == status
    assert "error" in answer.json()
    assert chat_server.bodies == []


async def test_an_allowed_origin_and_host_get_in(chat_server: ChatServer) -> None:
    chat_server.script = [Answer("ok")]
    options = {"allow_origins": ["https://app.example"], "allow_hosts": ["proxy.internal"]}
    async for served in serve(Harness(), chat_server, **options):
        answer = await one(
            served,
            "/v1/chat/completions",
            {"model": "m", "messages": ASK},
            origin="https://app.example",
            host="proxy.internal",
        )
    assert answer.status_code == 200


# -- bad input is the client's error ----------------------------------------------------

DEEP = b"[" * 100_000 + b"]" * 100_000

MALFORMED = [
    ("/v1/chat/completions", {"model": "m", "messages": [1, 2]}, "messages[0]"),
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": "abc"}]},
        "tool_calls",
    ),
    ("/v1/chat/completions", {"messages": ASK}, "model"),
    (
        "/v1/messages",
        {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": 5}]},
        "content",
    ),
    ("/v1/responses", {"model": "m", "input": [{"type": "function_call"}]}, "call_id"),
    ("/v1/chat/completions", {"model": "m", "messages": ASK, "max_tokens": 10**400}, "max_tokens"),
    ("/v1/messages", {"model": "c", "max_tokens": 10**400, "messages": ASK}, "max_tokens"),
    (
        "/v1/responses",
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
        "input[0].content[0].text",
    ),
    ("/v1/chat/completions", {"model": "m", "messages": ASK, "tools": [1]}, "tools[0]"),
    ("/v1/chat/completions", DEEP, "deeper"),
    ("/v1/chat/completions", b'{"model": "m", "messages": "\xff"}', "UTF-8"),
    ("/v1/chat/completions", b"[1, 2]", "JSON object"),
]


@pytest.mark.parametrize(("path", "body", "says"), MALFORMED)
async def test_a_malformed_body_is_a_400_in_the_apis_own_shape(
    chat_server: ChatServer, path: str, body: Any, says: str
) -> None:
    """Reported: each was a bare 500 with a traceback (and the clients retry a 500)."""
    async for served in serve(Harness(), chat_server):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        answer = await one(served, path, raw, **{"content-type": "application/json"})
    assert answer.status_code == 400
    shaped = answer.json()
    message = shaped["error"]["message"]
    assert says in message
    if path == "/v1/messages":
        assert shaped["type"] == "error"
        assert shaped["error"]["type"] == "invalid_request_error"
    assert chat_server.bodies == []


async def test_an_upstream_retry_after_that_is_no_number_is_no_500(chat_server: ChatServer) -> None:
    from tests.integrations.chat_server import Fail

    chat_server.script = [Fail(429, "slow", {"Retry-After": "1²"})]
    async for served in serve(Harness(), chat_server):
        answer = await one(served, "/v1/chat/completions", {"model": "m", "messages": ASK})
    assert answer.status_code == 429  # the upstream's own answer, passed on


async def test_a_truncated_upstream_body_is_retried_then_a_502(chat_server: ChatServer) -> None:
    from guardstack.wrappers import Retry
    from tests.integrations.chat_server import Broken

    harness = Harness()
    harness.plugin(Retry(stage="model", attempts=2, backoff_ms=1))
    chat_server.script = [Broken(), Broken()]
    async for served in serve(harness, chat_server):
        answer = await one(served, "/v1/chat/completions", {"model": "m", "messages": ASK})
    assert answer.status_code == 502
    assert "did not answer in full" in answer.json()["error"]["message"]
    assert len(chat_server.bodies) == 2  # retried before any byte reached the client


# -- bounded ----------------------------------------------------------------------------


async def test_a_declared_oversized_body_is_refused_before_it_is_read(
    chat_server: ChatServer,
) -> None:
    """Reported: a declared 50 MB body held the connection (200 MiB were read)."""
    async for served in serve(Harness(), chat_server, max_body_bytes=1024):
        with anyio.fail_after(5):
            stream = await anyio.connect_tcp("127.0.0.1", served.port)
            async with stream:
                await stream.send(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 52428800\r\n\r\n"
                )
                head = await stream.receive()  # answered without sending a byte of body
    assert head.startswith(b"HTTP/1.1 413")


async def test_a_body_without_a_length_is_read_only_up_to_the_limit(
    chat_server: ChatServer,
) -> None:
    async def endless() -> AsyncIterator[bytes]:
        for _ in range(10_000):
            yield b" " * 1024

    async for served in serve(Harness(), chat_server, max_body_bytes=4096):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as client:
            answer = await client.post(
                "/v1/chat/completions",
                content=endless(),
                headers={"content-type": "application/json"},
            )
    assert answer.status_code == 413


async def test_conversations_are_freed_and_their_caps_are_kept(chat_server: ChatServer) -> None:
    harness = Harness()
    harness.plugin(ModelCallLimit(per_session=1))
    chat_server.script = [Answer("ok")] * 20
    async for served in serve(harness, chat_server, max_conversations=5):
        for number in range(12):
            header = {"x-guardstack-conversation": f"c-{number}"}
            await one(served, "/v1/chat/completions", {"model": "m", "messages": ASK}, **header)
        assert len(served.proxy.conversations) == 5
        again = await one(
            served,
            "/v1/chat/completions",
            {"model": "m", "messages": ASK},
            **{"x-guardstack-conversation": "c-0"},
        )
    assert again.headers.get("x-guardstack-stopped") == "model-call-limit"  # still counted
    assert len(chat_server.bodies) == 12


# -- the whole model stage -------------------------------------------------------------


async def test_the_whole_model_stage_runs_behind_the_proxy(chat_server: ChatServer) -> None:
    """Reported: no chat span from tracing, and budget-notice never spoke."""
    from guardstack.wrappers import Tracing
    from tests.wrappers.otel import SpanRig

    rig = SpanRig()
    harness = Harness()
    harness.plugin(Tracing(rig.provider))
    harness.plugin(ModelCallLimit(per_turn=5))
    harness.plugin(BudgetNotice(show=("model_calls",)))
    chat_server.script = [Answer("noted")]
    async for served in serve(harness, chat_server):
        await one(served, "/v1/chat/completions", {"model": "m", "messages": ASK})
    [sent] = chat_server.requests
    assert sent["messages"][-1]["content"].startswith("Budget left:")  # the notice went up
    assert any(span.name.startswith("chat") for span in rig.spans)


async def test_budget_notice_notes_every_request_of_a_turn_behind_the_proxy(
    chat_server: ChatServer,
) -> None:
    """Reported: only the first request of a turn was noted (it notes once per step, and
    the proxy never advanced the step, though each forwarded request is one)."""
    harness = Harness()
    harness.plugin(ModelCallLimit(per_turn=5))
    harness.plugin(BudgetNotice(show=("model_calls",)))
    chat_server.script = [Answer("noted")] * 3
    asked = [*ASK]
    async for served in serve(harness, chat_server):
        for _ in range(3):  # one turn: the person's message, then the model's answers
            await one(served, "/v1/chat/completions", {"model": "m", "messages": asked})
            asked = [*asked, {"role": "assistant", "content": "noted"}]
    notices = [sent["messages"][-1]["content"] for sent in chat_server.requests]
    assert notices == [
        "Budget left: 5 model calls. Plan to finish within it.",
        "Budget left: 4 model calls. Plan to finish within it.",
        "Budget left: 3 model calls. Plan to finish within it.",
    ]


# -- the Responses API ------------------------------------------------------------------


async def test_the_responses_api_json_with_tool_calls_guarded(
    responses_server: ResponsesServer,
) -> None:
    responses_server.reset()
    harness = Harness()
    harness.plugin(RepeatToolReminder(thresholds=(2,)))
    responses_server.script = [Said("Done.")]
    history: Any = [
        {"role": "user", "content": "Find it"},
        *[
            item
            for n in range(2)
            for item in (
                {"type": "function_call", "call_id": f"c{n}", "name": "grep",
                 "arguments": '{"q": "x"}'},
                {"type": "function_call_output", "call_id": f"c{n}", "output": "nothing"},
            )
        ],
    ]  # fmt: skip
    async for served in serve(harness, responses_server):
        async with served.client() as client:
            reply = await client.responses.create(model="m", input=history)
    assert reply.output_text == "Done."
    assert reply.usage is not None
    assert reply.usage.input_tokens == 12
    sent = responses_server.requests[0]["input"]
    assert sent[-1]["role"] == "user"  # the reminder, as the person's words, after the rest
    assert "repeating the exact same tool call" in sent[-1]["content"]


async def test_the_responses_api_stream_and_a_stop(responses_server: ResponsesServer) -> None:
    responses_server.reset()
    harness = Harness()
    harness.plugin(ModelCallLimit(per_turn=1))
    responses_server.script = [Said("Streamed here.")]
    async for served in serve(harness, responses_server):
        async with served.client() as client:
            stream: Any = await client.responses.create(model="m", input="hi", stream=True)
            kinds = [event.type async for event in stream]
            history: Any = [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ]
            stopped: Any = await client.responses.create(model="m", input=history, stream=True)
            stop_events = [event async for event in stopped]
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert stop_events[-1].type == "response.completed"
    assert "Stopped by model-call-limit" in stop_events[-1].response.output_text
    assert len(responses_server.requests) == 1


# -- fuzz: never a 500 ------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"model": st.one_of(st.text(max_size=5), json_values)},
        optional={
            "messages": json_values,
            "input": json_values,
            "max_tokens": json_values,
            "stream": st.booleans(),
            "tools": json_values,
        },
    ),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/messages", "/v1/responses"]))
async def test_no_generated_body_is_ever_a_500(
    chat_server: ChatServer, body: Any, path: str
) -> None:
    chat_server.script = [Answer("ok")] * 2
    async for served in serve(Harness(), chat_server):
        answer = await one(served, path, json.dumps(body).encode(),
                           **{"content-type": "application/json"})  # fmt: skip
    if answer.status_code == 500:  # the upstream's own (it speaks chat completions only),
        assert answer.text.startswith("No handler found")  # passed on as it came
    else:
        assert answer.status_code < 500 or answer.status_code == 502
        if answer.status_code >= 400:
            assert "error" in answer.json()
    chat_server.reset()


# -- manual control at /admin/control ---------------------------------------------------------

ADMIN_KEY = "an-admin-key-of-some-length"


async def test_the_admin_route_needs_its_key_and_controls_the_stack(
    chat_server: ChatServer,
) -> None:
    """Without the admin key, 401 and nothing changes; with it, a model's breaker forced
    open (its requests answered 503 with Retry-After, the upstream never asked), a
    limit changed, both released; a mistake is a 400 naming what exists."""
    from guardstack.wrappers import CircuitBreaker, TokenRateLimit

    harness = Harness()
    harness.plugin(CircuitBreaker(stage="model", break_s=60))
    harness.plugin(TokenRateLimit(requests_per_minute=1_000, wait=False))
    chat_server.script = [Answer("after"), Answer("again")]
    body = {"model": "m", "messages": ASK}
    async for served in serve(harness, chat_server, admin_key=ADMIN_KEY):
        base = f"http://127.0.0.1:{served.port}"
        async with httpx.AsyncClient(base_url=base) as raw:
            admin = {"authorization": f"bearer {ADMIN_KEY}"}
            nobody = await raw.post("/admin/control", json={"action": "force_open", "tool": "m"})
            assert nobody.status_code == 401
            assert nobody.json()["error"]["type"] == "authentication"
            assert (await raw.get("/admin/control", headers=admin)).json() == {"overrides": []}
            browser = await raw.get(
                "/admin/control", headers={**admin, "origin": "https://evil.example"}
            )
            assert browser.status_code == 403
            forced = await raw.post(
                "/admin/control",
                json={"action": "force_open", "tool": "m", "by": "oncall"},
                headers=admin,
            )
            assert forced.status_code == 200
            [override] = forced.json()["overrides"]
            assert (override["kind"], override["tool"], override["by"]) == (
                "breaker",
                "m",
                "oncall",
            )
            refused = await raw.post("/v1/chat/completions", json=body)
            assert refused.status_code == 503
            assert 55 <= int(refused.headers["retry-after"]) <= 60
            assert "an operator holds it open" in refused.json()["error"]["message"]
            assert chat_server.requests == []  # the upstream was never asked
            await raw.post("/admin/control", json={"action": "release", "tool": "m"}, headers=admin)
            limited = await raw.post(
                "/admin/control",
                json={
                    "action": "set_limit",
                    "layer": "token-rate-limit",
                    "values": {"requests_per_minute": 1},
                },
                headers=admin,
            )
            assert limited.status_code == 200
            assert (await raw.post("/v1/chat/completions", json=body)).status_code == 200
            second = await raw.post("/v1/chat/completions", json=body)
            assert second.status_code == 429
            assert "1 of its 1 requests per minute" in second.json()["error"]["message"]
            wrong = await raw.post(
                "/admin/control",
                json={"action": "set_limit", "layer": "token-rate-limt", "values": {"x": 1}},
                headers=admin,
            )
            assert wrong.status_code == 400
            assert "did you mean 'token-rate-limit'" in wrong.json()["error"]["message"]
            junk = await raw.post(
                "/admin/control",
                content=b"{",
                headers={**admin, "content-type": "application/json"},
            )
            assert junk.status_code == 400
            unknown = await raw.post("/admin/control", json={"action": "explode"}, headers=admin)
            assert unknown.status_code == 400
            assert "one of force_open" in unknown.json()["error"]["message"]


def test_a_short_admin_key_is_refused() -> None:
    from guardstack.gateway.model_proxy import ModelProxy
    from guardstack.pipeline import ConfigError

    with pytest.raises(ConfigError, match="16 characters"):
        ModelProxy(Harness(), "http://127.0.0.1:9", admin_key="short")


# -- reservations that fit real agents ---------------------------------------------------


@pytest.mark.parametrize(("estimate", "served_most"), [("auto", 100), ("max", 6)])
async def test_a_32000_token_max_tokens_does_not_use_a_day_up_in_reservations(
    estimate: str, served_most: int
) -> None:
    """Reported: Claude Code asks ``max_tokens: 32000`` on every request; each reserved
    $0.48 at $15/M, so a $0.50 day stopped it after 4 requests having spent $0.016.
    Behind the proxy a reservation is what that model's answers used (``estimate:
    auto``); ``estimate: max`` keeps reserving the maximum."""
    from tests.integrations.runaway import Runaway

    harness = Harness()
    harness.load(
        [{"name": "usage-limit", "config": {"usd_per_day": 0.5, "estimate": estimate,
                                            "prices": {"claude-x": [3, 15]}}}]
    )  # fmt: skip
    served = 0
    with Runaway(bound=0, usage=(1_000, 50)) as runaway:

        class Upstream:
            base_url = runaway.url

        async for proxy in serve(harness, Upstream()):
            for number in range(120):
                answer = await one(
                    proxy, "/v1/messages",
                    {"model": "claude-x", "max_tokens": 32_000,
                     "messages": [{"role": "user", "content": f"Task {number}."}]},
                )  # fmt: skip
                if "x-guardstack-stopped" in answer.headers:
                    break
                served += 1
    assert served >= served_most if estimate == "auto" else served <= served_most
