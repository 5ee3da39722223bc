"""``ModelProxy`` end to end: the official ``openai`` client on one side, a loopback
server speaking the chat-completions wire protocol on the other, the proxy served by
uvicorn between them (real time, asyncio: uvicorn and the client are asyncio's)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import uvicorn
from openai import AsyncOpenAI, BadRequestError

from guardstack.gateway.model_proxy import DEFAULT, ModelProxy
from guardstack.guards import GENTLE_TEXT, RepeatToolReminder, ToolCallLimit
from guardstack.pipeline import Harness
from guardstack.wrappers import Retry
from tests.integrations.chat_server import Answer, ChatServer, Fail
from tests.integrations.ports import free_port, until_listening


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Served:
    def __init__(self, proxy: ModelProxy, port: int) -> None:
        self.proxy, self.port = proxy, port

    def client(self, **options: Any) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1",
            api_key="the-clients-own-key",
            max_retries=0,
            **options,
        )


async def serve(harness: Harness, upstream: Any, **options: Any) -> AsyncIterator[Served]:
    options.setdefault("upstream_key", "upstream-key")
    proxy = ModelProxy(harness, upstream.base_url.removesuffix("/v1"), **options)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(proxy.app, host="127.0.0.1", port=port, log_level="warning")
    )
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn sets it, no event to wait on
                await anyio.sleep(0.01)
        try:
            yield Served(proxy, port)
        finally:
            server.should_exit = True
            await proxy.aclose()


@pytest.fixture(params=["aiohttp", "httpx"])
def upstream_client(request: pytest.FixtureRequest) -> str:
    """Both HTTP clients that reach the upstream (``--upstream-client``)."""
    return str(request.param)


@pytest.fixture
async def served(chat_server: ChatServer, upstream_client: str) -> AsyncIterator[Served]:
    harness = Harness()
    harness.plugin(Retry(stage="model", attempts=3, backoff_ms=10))
    harness.plugin(RepeatToolReminder())
    harness.plugin(ToolCallLimit(per_turn=4))
    async for running in serve(harness, chat_server, upstream_client=upstream_client):
        yield running


def upstream_connections(proxy: ModelProxy) -> int:
    """The connections the proxy holds open to its default upstream, in either client's
    pool (read from their insides: neither says it otherwise)."""
    target = proxy.upstreams[DEFAULT]
    held = len(target.client._transport._pool.connections)
    session = target._session
    if session is not None:
        pool = session.connector
        held += len(pool._acquired) + sum(len(idle) for idle in pool._conns.values())
    return held


ASK: Any = [{"role": "user", "content": "What is in the repo?"}]


async def test_with_nothing_to_add_the_bytes_pass_through_both_ways(
    served: Served, chat_server: ChatServer
) -> None:
    chat_server.script = [Answer("Direct."), Answer("Direct.")]
    direct = AsyncOpenAI(base_url=chat_server.base_url, api_key="upstream-key", max_retries=0)
    async with direct:
        first = await direct.chat.completions.create(model="m", messages=ASK, temperature=0.2)
    async with served.client() as client:
        second = await client.chat.completions.with_raw_response.create(
            model="m", messages=ASK, temperature=0.2
        )
    assert chat_server.bodies[1] == chat_server.bodies[0]  # the client's body, unchanged
    assert second.parse().model_dump() == first.model_dump()  # the upstream's reply, unchanged
    sent = chat_server.headers[1]
    assert {k.lower(): v for k, v in sent.items()}["authorization"] == "Bearer upstream-key"
    assert "the-clients-own-key" not in json.dumps(sent)


async def test_a_stream_passes_through_chunk_by_chunk(
    served: Served, chat_server: ChatServer
) -> None:
    chat_server.script = [Answer("Streamed answer here.")]
    async with served.client() as client:
        stream: Any = await client.chat.completions.create(model="m", messages=ASK, stream=True)
        pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
    assert "".join(piece or "" for piece in pieces) == "Streamed answer here."
    assert json.loads(chat_server.bodies[0])["stream"] is True


async def test_a_429_with_retry_after_is_absorbed_by_retry(
    served: Served, chat_server: ChatServer
) -> None:
    chat_server.script = [Fail(429, "slow down", {"Retry-After": "0.2"}), Answer("After the wait.")]
    async with served.client() as client:
        started = anyio.current_time()
        reply = await client.chat.completions.create(model="m", messages=ASK)
        waited = anyio.current_time() - started
    assert reply.choices[0].message.content == "After the wait."
    assert len(chat_server.bodies) == 2
    assert waited >= 0.2  # the upstream's Retry-After, honoured


async def test_an_upstream_error_keeps_its_status_and_body(
    served: Served, chat_server: ChatServer
) -> None:
    chat_server.script = [Fail(400, "context too long")]
    async with served.client() as client:
        with pytest.raises(BadRequestError) as refused:
            await client.chat.completions.create(model="m", messages=ASK)
    assert refused.value.status_code == 400
    assert "context too long" in str(refused.value)


async def test_a_looping_client_is_reminded_then_stopped(
    served: Served, chat_server: ChatServer
) -> None:
    """A client that repeats one tool call: the history it sends grows each round; the
    proxy sees each call once, reminds through the forwarded request, then stops it."""
    messages: list[Any] = list(ASK)
    chat_server.script = [
        Answer(None, tool_calls=((f"c{n}", "grep", '{"q": "TODO"}'),)) for n in range(10)
    ]
    stops: list[tuple[str | None, str]] = []
    async with served.client() as client:
        for _ in range(8):
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=messages
            )
            reply = raw.parse()
            choice = reply.choices[0]
            if choice.finish_reason == "stop":
                stops.append(
                    (raw.headers.get("x-guardstack-stopped"), choice.message.content or "")
                )
                break
            [call] = choice.message.tool_calls or []
            messages.append(choice.message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "src/a.py:1"})
    forwarded = [json.loads(body)["messages"] for body in chat_server.bodies]
    reminded = [
        index
        for index, sent in enumerate(forwarded)
        if sent[-1]["role"] == "user" and GENTLE_TEXT in sent[-1]["content"]
    ]
    assert reminded  # the reminder reached the model, as a user message after the results
    [(plugin, text)] = stops
    assert plugin == "tool-call-limit"
    assert text.startswith("Stopped by tool-call-limit: tool call limit reached")
    # the first request and four with a call's result reached the upstream; the one
    # carrying the fifth call's result (one over the cap of 4) was answered by the proxy
    assert len(chat_server.bodies) == 5


async def test_the_command_serves_a_config_with_the_key_from_the_environment(
    chat_server: ChatServer, tmp_path: Any
) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    config = tmp_path / "guards.yaml"
    config.write_text("- name: tool-call-limit\n  config: {per_turn: 4}\n", "utf-8")
    port = free_port()
    command = [
        sys.executable, "-c", "from guardstack.cli.main import main; raise SystemExit(main())",
        "model-proxy", "--config", str(config), "--upstream",
        chat_server.base_url.removesuffix("/v1"), "--upstream-key-env", "GUARDSTACK_TEST_KEY",
        "--listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    environment = {
        **os.environ,
        "GUARDSTACK_TEST_KEY": "from-the-environment",
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    chat_server.script = [Answer("Through the command.")]
    process = await anyio.open_process(
        command, cwd=str(Path(__file__).parents[3]), env=environment, stderr=subprocess.DEVNULL
    )
    try:
        await until_listening(port)
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        async with client:
            reply = await client.chat.completions.create(model="m", messages=ASK)
    finally:
        process.terminate()
        with anyio.fail_after(10):
            await process.wait()
    assert reply.choices[0].message.content == "Through the command."
    sent = {k.lower(): v for k, v in chat_server.headers[0].items()}
    assert sent["authorization"] == "Bearer from-the-environment"


async def test_pydantic_ais_own_openai_model_runs_an_agent_through_the_proxy(
    served: Served, chat_server: ChatServer
) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    calls: list[str] = []

    def grep(q: str) -> str:
        """Search the code."""
        calls.append(q)
        return "src/a.py:1: TODO"

    chat_server.script = [
        Answer(None, tool_calls=(("p1", "grep", '{"q": "TODO"}'),)),
        Answer("One TODO, in src/a.py."),
    ]
    provider = OpenAIProvider(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="theirs")
    agent = Agent(OpenAIChatModel("m", provider=provider), tools=[grep])
    try:
        result = await agent.run("Find the TODOs")
    finally:
        await provider.client.close()
    assert result.output == "One TODO, in src/a.py."
    assert calls == ["TODO"]
    assert len(chat_server.bodies) == 2  # both of the agent's requests went upstream


async def test_a_client_that_leaves_a_hung_stream_lets_go_of_the_upstream_after_the_drain(
    chat_server: ChatServer, upstream_client: str
) -> None:
    import httpx

    from tests.integrations.chat_server import Hang

    chat_server.script = [Hang()]
    body = {"model": "m", "messages": ASK, "stream": True}
    options = {"drain_ms": 300, "upstream_client": upstream_client}
    async for served in serve(Harness(), chat_server, **options):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as client:

            async def read() -> None:
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    async for _ in response.aiter_raw():
                        pass

            async with anyio.create_task_group() as group:
                group.start_soon(read)
                with anyio.fail_after(5):  # the hung stream's, while the client waits on it
                    while upstream_connections(served.proxy) != 1:  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                group.cancel_scope.cancel()  # the client leaves
        # the proxy read on for its usage for drain_ms, then let go of the upstream: its
        # connection pool is empty
        with anyio.fail_after(5):
            while upstream_connections(served.proxy):  # noqa: ASYNC110
                await anyio.sleep(0.05)


async def test_a_client_that_leaves_before_the_usage_chunk_is_charged_what_was_reported(
    chat_server: ChatServer,
) -> None:
    """Reported: three ~1,000-token streams whose clients left early left the day's
    window untouched. The proxy reads on to the usage chunk and charges it."""
    import httpx

    from guardstack.guards import UsageLimit
    from guardstack.pipeline import MemoryStore
    from guardstack.pipeline.contract import Window, store_key

    store = MemoryStore()
    harness = Harness(store=store)
    harness.plugin(UsageLimit(tokens_per_day=100_000, tenant="t"))
    chat_server.script = [Answer("A long answer " * 50, usage=(600, 400))]
    body = {"model": "m", "messages": ASK, "stream": True}  # no include_usage asked
    async for served in serve(harness, chat_server):
        async with (
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            async for _ in response.aiter_raw():
                break  # the first bytes, then gone
        import datetime

        today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        day = Window(store_key("usage-limit", "tenant", "t", "tokens", f"day:{today}"), "tokens")
        with anyio.fail_after(5):
            while await store.balance(day) != 1_000:  # noqa: ASYNC110
                await anyio.sleep(0.05)
    assert json.loads(chat_server.bodies[0])["stream_options"] == {"include_usage": True}


LATER: Any = [  # the same conversation (same key, same first message), a turn later
    *ASK,
    {"role": "assistant", "content": "Long answer."},
    {"role": "user", "content": "And?"},
]


@pytest.mark.parametrize(
    ("limit", "then", "stopped_saying"),
    [
        (
            {"tokens_per_session": 100, "estimate_output_tokens": 1},
            LATER,
            "this session used 110 tokens",
        ),
        # a calendar window settles what the stream reported, not its reservation (the
        # stream is relayed inside the model call)
        (
            {"tokens_per_day": 115, "estimate_output_tokens": 1},
            [{"role": "user", "content": "A new conversation"}],
            "has used 110 tokens this day",
        ),
    ],
    ids=["session-cap", "tenants-day"],
)
async def test_a_streams_usage_counts_against_the_next_requests_caps(
    chat_server: ChatServer, limit: dict[str, Any], then: Any, stopped_saying: str
) -> None:
    from guardstack.guards import UsageLimit

    harness = Harness()
    harness.plugin(UsageLimit(**limit))
    chat_server.script = [Answer("Long answer.", usage=(80, 30)), Answer("Never sent.")]
    async for served in serve(harness, chat_server):
        async with served.client() as client:
            stream: Any = await client.chat.completions.create(
                model="m", messages=ASK, stream=True, stream_options={"include_usage": True}
            )
            async for _ in stream:
                pass
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=then)
    assert raw.headers.get("x-guardstack-stopped") == "usage-limit"
    assert stopped_saying in (raw.parse().choices[0].message.content or "")
    assert len(chat_server.bodies) == 1  # the second request never reached the upstream


# -- Anthropic's Messages API ------------------------------------------------------------


async def test_the_messages_api_passes_through_and_a_looping_client_is_reminded_then_stopped(
    messages_server: Any,
) -> None:
    from anthropic import AsyncAnthropic

    from tests.integrations.messages_server import Reply

    harness = Harness()
    harness.plugin(RepeatToolReminder())
    harness.plugin(ToolCallLimit(per_turn=4))
    messages_server.script = [Reply("Direct."), Reply("Direct.")] + [
        Reply(None, tool_uses=((f"t{n}", "grep", {"q": "TODO"}),), stop_reason="tool_use")
        for n in range(8)
    ]
    ask: Any = [{"role": "user", "content": "What is in the repo?"}]
    direct = AsyncAnthropic(base_url=messages_server.base_url, api_key="k", max_retries=0)
    async with direct:
        first = await direct.messages.create(model="claude-test", max_tokens=100, messages=ask)
    async for served in serve(harness, messages_server):
        client = AsyncAnthropic(
            base_url=f"http://127.0.0.1:{served.port}", api_key="theirs", max_retries=0
        )
        async with client:
            second = await client.messages.create(model="claude-test", max_tokens=100, messages=ask)
            assert messages_server.bodies[1] == messages_server.bodies[0]
            assert second.model_dump() == first.model_dump()
            sent = {k.lower(): v for k, v in messages_server.headers[1].items()}
            assert sent["x-api-key"] == "upstream-key"  # never the client's own
            messages: list[Any] = [{"role": "user", "content": "Find the TODOs"}]
            stopped = None
            for _ in range(8):
                raw = await client.messages.with_raw_response.create(
                    model="claude-test", max_tokens=100, messages=messages
                )
                reply = await raw.parse()  # async in anthropic's client
                if reply.stop_reason == "end_turn":
                    stopped = (raw.headers.get("x-guardstack-stopped"), reply.content[0])
                    break
                [use] = [block for block in reply.content if block.type == "tool_use"]
                messages.append({"role": "assistant", "content": [use.model_dump()]})
                result = {"type": "tool_result", "tool_use_id": use.id, "content": "src/a.py:1"}
                messages.append({"role": "user", "content": [result]})
    assert stopped is not None
    plugin, block = stopped
    assert plugin == "tool-call-limit"
    assert getattr(block, "text", "").startswith("Stopped by tool-call-limit")
    forwarded = [json.loads(body)["messages"] for body in messages_server.bodies[2:]]
    reminded = [
        sent[-1]["content"][-1]["text"]
        for sent in forwarded
        if isinstance(sent[-1]["content"], list) and sent[-1]["content"][-1].get("type") == "text"
    ]
    assert reminded
    assert GENTLE_TEXT in reminded[0]


async def test_a_days_tokens_are_shared_by_the_clients_of_one_tenant(
    chat_server: ChatServer,
) -> None:
    from guardstack.guards import UsageLimit

    harness = Harness()
    harness.plugin(UsageLimit(tokens_per_day=20, estimate_output_tokens=1))
    chat_server.script = [Answer("For acme.", usage=(10, 5)), Answer("For other.", usage=(10, 5))]
    keys = {"key-a1": "acme", "key-a2": "acme", "key-o": "other"}
    async for served in serve(harness, chat_server, client_keys=keys):

        def client(key: str, port: int = served.port) -> AsyncOpenAI:
            url = f"http://127.0.0.1:{port}/v1"
            return AsyncOpenAI(base_url=url, api_key=key, max_retries=0)

        async with client("key-a1") as first, client("key-a2") as second:
            spent = await first.chat.completions.create(model="m", messages=ASK)
            refused = await second.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "another conversation"}]
            )
        async with client("key-o") as other:
            fine = await other.chat.completions.create(model="m", messages=ASK)
        async with client("not-a-key") as stranger:
            with pytest.raises(Exception, match="401"):
                await stranger.chat.completions.create(model="m", messages=ASK)
    assert spent.choices[0].message.content == "For acme."
    assert refused.headers.get("x-guardstack-stopped") == "usage-limit"
    stop_text = refused.parse().choices[0].message.content or ""
    assert "tenant 'acme' has used 15 tokens this day" in stop_text
    assert fine.choices[0].message.content == "For other."  # another tenant's own day
    assert len(chat_server.bodies) == 2


def test_a_keys_file_in_the_earlier_shape_is_read_and_a_bad_one_named(tmp_path: Any) -> None:
    """``--keys`` is an alias of ``--tenants`` that reads the earlier ``{key: tenant}``."""
    from guardstack.gateway.tenants import read_tenants
    from guardstack.pipeline import ConfigError

    good = tmp_path / "keys.yaml"
    good.write_text("sk-a: team-a\nsk-b: team-b\n", "utf-8")
    read = read_tenants(good)
    assert {key: entry.tenant for key, entry in read.keys.items()} == {
        "sk-a": "team-a",
        "sk-b": "team-b",
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text("- sk-a\n- sk-b\n", "utf-8")
    with pytest.raises(ConfigError, match=r"bad\.yaml: tenants: a mapping"):
        read_tenants(bad)


# -- several upstreams, and streams through the whole model stage --------------------------


@pytest.fixture
def backup_server() -> Any:
    server = ChatServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_fallback_sends_the_request_to_another_upstream(
    chat_server: ChatServer, backup_server: ChatServer, stream: bool
) -> None:
    from guardstack.wrappers import Fallback

    harness = Harness()
    harness.plugin(Fallback(stage="model", to={"upstream": "backup", "model": "backup-model"}))
    chat_server.script = [Fail(503, "down for maintenance")]
    backup_server.script = [Answer("From the backup.")]
    backup = backup_server.base_url.removesuffix("/v1")
    async for served in serve(
        harness, chat_server, upstreams={"backup": backup}, upstream_keys={"backup": "backup-key"}
    ):
        async with served.client() as client:
            if stream:
                chunks: Any = await client.chat.completions.create(
                    model="m", messages=ASK, stream=True
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in chunks if c.choices]
                )
            else:
                reply = await client.chat.completions.create(model="m", messages=ASK)
                text = reply.choices[0].message.content or ""
    assert text == "From the backup."
    assert len(chat_server.bodies) == 1  # the default upstream was asked once
    assert json.loads(backup_server.bodies[0])["model"] == "backup-model"
    assert backup_server.headers[0]["authorization"] == "Bearer backup-key"
    assert json.loads(backup_server.bodies[0])["messages"] == ASK


async def test_an_unreachable_upstream_falls_back_too(backup_server: ChatServer) -> None:
    from guardstack.wrappers import Fallback

    class Nowhere:
        base_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there

    harness = Harness()
    harness.plugin(Fallback(stage="model", to={"upstream": "backup"}))
    backup_server.script = [Answer("Still answered.")]
    backup = backup_server.base_url.removesuffix("/v1")
    async for served in serve(harness, Nowhere(), upstreams={"backup": backup}):
        async with served.client() as client:
            reply = await client.chat.completions.create(model="m", messages=ASK)
    assert reply.choices[0].message.content == "Still answered."
    assert json.loads(backup_server.bodies[0])["model"] == "m"  # no model named: unchanged


async def test_a_fallback_naming_no_upstream_is_refused_at_start_naming_file_and_near_name(
    tmp_path: Any,
) -> None:
    from guardstack.cli.model_proxy import run_model_proxy
    from guardstack.pipeline import ConfigError

    config = tmp_path / "guards.yaml"
    config.write_text(
        "- name: fallback\n  config: {stage: model, to: {upstream: bakup}}\n", "utf-8"
    )
    with pytest.raises(ConfigError) as refused:
        await run_model_proxy(
            config, ["http://127.0.0.1:1", "backup=http://127.0.0.1:2"], listen="127.0.0.1:9"
        )
    message = str(refused.value)
    assert str(config) in message
    assert "fallback: `to.upstream` names 'bakup'" in message
    assert "did you mean 'backup'?" in message


def test_upstream_options_name_their_upstreams_and_refuse_what_is_ambiguous() -> None:
    from guardstack.cli.model_proxy import named_options
    from guardstack.pipeline import ConfigError

    urls = ["https://api.example/v1?x=1", "backup=http://127.0.0.1:9000"]
    assert named_options(urls, "--upstream", default_required=True) == {
        "default": "https://api.example/v1?x=1",  # a query's "=" is not a name
        "backup": "http://127.0.0.1:9000",
    }
    with pytest.raises(ConfigError, match="needs one unnamed URL"):
        named_options(["backup=http://127.0.0.1:9000"], "--upstream", default_required=True)
    with pytest.raises(ConfigError, match="given twice for 'backup'"):
        named_options(["backup=http://a", "backup=http://b"], "--upstream", default_required=False)


def test_the_event_loop_option_uses_uvloop_only_when_asked_or_present(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from guardstack.cli.model_proxy import event_loop_options
    from guardstack.pipeline import ConfigError

    assert event_loop_options("asyncio") == {}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # not installed
    assert event_loop_options("auto") == {}
    with pytest.raises(ConfigError, match="--loop uvloop needs uvloop: pip install uvloop"):
        event_loop_options("uvloop")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # installed
    assert event_loop_options("auto") == {"use_uvloop": True}
    assert event_loop_options("uvloop") == {"use_uvloop": True}


async def test_an_anthropic_streams_usage_counts_cache_tokens_too(messages_server: Any) -> None:
    from anthropic import AsyncAnthropic

    from guardstack.guards import UsageLimit
    from tests.integrations.messages_server import Reply

    harness = Harness()
    # each request reserves its input and its max_tokens (10): 6 + 10 fit under 120,
    # and the second's (105 spent, then 8 + 10) would pass it
    harness.plugin(UsageLimit(tokens_per_session=120))
    # 20 plain input + 40 read from the cache + 10 written to it, 35 out: 105 tokens
    messages_server.script = [Reply("Streamed.", usage=(20, 35, 40, 10)), Reply("Never.")]
    ask: Any = [{"role": "user", "content": "What is in the repo?"}]
    async for served in serve(harness, messages_server):
        client = AsyncAnthropic(
            base_url=f"http://127.0.0.1:{served.port}", api_key="theirs", max_retries=0
        )
        async with client:
            async with client.messages.stream(
                model="claude-test", max_tokens=10, messages=ask
            ) as stream:
                text = await stream.get_final_text()
            later: Any = [*ask, {"role": "assistant", "content": text},
                          {"role": "user", "content": "And?"}]  # fmt: skip
            raw = await client.messages.with_raw_response.create(
                model="claude-test", max_tokens=10, messages=later
            )
            stopped = await raw.parse()
    assert text == "Streamed."
    assert raw.headers.get("x-guardstack-stopped") == "usage-limit"
    assert "this session used 105 tokens" in getattr(stopped.content[0], "text", "")
    assert len(messages_server.bodies) == 1


async def test_a_stream_is_retried_before_its_first_byte_never_after(
    chat_server: ChatServer,
) -> None:
    import httpx

    from tests.integrations.chat_server import Broken

    harness = Harness()
    harness.plugin(
        Retry(
            stage="model",
            attempts=3,
            backoff_ms=10,
            retry_on=["MODEL_RATE_LIMITED", "MODEL_FAILED"],
        )
    )
    chat_server.script = [Fail(429, "slow down", {"Retry-After": "0.1"}), Answer("Whole.")]
    body = {"model": "m", "messages": ASK, "stream": True}
    async for served in serve(harness, chat_server):
        async with served.client() as client:
            chunks: Any = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        assert text == "Whole."  # the 429 came before any byte: retried
        assert len(chat_server.bodies) == 2
        chat_server.reset()
        chat_server.script = [Broken("partial"), Answer("A second answer would be a lie.")]
        received: list[bytes] = []

        async def read(raw: httpx.AsyncClient, into: list[bytes]) -> None:
            async with raw.stream("POST", "/v1/chat/completions", json=body) as response:
                async for piece in response.aiter_raw():
                    into.append(piece)

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            await read(raw, received)  # the stream ends with the API's error, not cleanly
    assert b'"par"' in b"".join(received)  # the first chunks reached the client...
    assert len(chat_server.bodies) == 1  # ...so the break was not retried
    last = b"".join(received).strip().split(b"\n\n")[-1]
    assert json.loads(last.removeprefix(b"data: "))["error"]["code"] == "stream_cut"
    assert b"[DONE]" not in b"".join(received)


async def test_the_official_sync_client_gets_json_and_streams_through_the_proxy(
    served: Served, chat_server: ChatServer
) -> None:
    from openai import OpenAI

    chat_server.script = [Answer("Sync JSON."), Answer("Sync stream.")]

    def use_the_sync_client() -> tuple[str, str]:
        url = f"http://127.0.0.1:{served.port}/v1"
        with OpenAI(base_url=url, api_key="theirs", max_retries=0) as client:
            reply = client.chat.completions.create(model="m", messages=ASK)
            chunks = client.chat.completions.create(model="m", messages=ASK, stream=True)
            streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return reply.choices[0].message.content or "", streamed

    # the sync client blocks its thread; the proxy serves on this test's event loop
    text, streamed = await anyio.to_thread.run_sync(use_the_sync_client)
    assert (text, streamed) == ("Sync JSON.", "Sync stream.")
    assert [json.loads(body).get("stream") for body in chat_server.bodies] == [None, True]


async def test_a_stream_that_does_not_start_is_retried_and_a_stalled_one_is_cut(
    chat_server: ChatServer,
) -> None:
    """Behind the proxy, Timeout's first byte and idle bounds hold as in process: an
    upstream that never starts is sent the request again (the client sees the second
    answer); one that stalls after its first bytes is cut, and the client's stream ends
    with the API's error event."""
    import httpx

    from guardstack.wrappers import Timeout
    from tests.integrations.chat_server import Paused

    harness = Harness()
    harness.plugin(Retry(stage="model", attempts=2, backoff_ms=1))
    harness.plugin(Timeout(stage="model", first_byte_ms=300, idle_ms=300))
    chat_server.script = [Paused(Answer("never"), at=0, pause_s=3.0), Answer("Second try.")]
    async for served in serve(harness, chat_server):
        async with served.client() as client:
            started = anyio.current_time()
            chunks: Any = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
            assert anyio.current_time() - started < 2.0
        assert text == "Second try."
        assert len(chat_server.bodies) == 2
        chat_server.reset()
        chat_server.script = [Paused(Answer("half then nothing"), at=3, pause_s=3.0)]
        body = {"model": "m", "messages": ASK, "stream": True}
        received: list[bytes] = []

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            started = anyio.current_time()
            await _read_stream(raw, body, received)
            assert anyio.current_time() - started < 2.0
        assert b'"hal"' in b"".join(received)
        assert b'"stream_cut"' in b"".join(received).rsplit(b"\n\n", 2)[-2]
        assert len(chat_server.bodies) == 1  # bytes had gone out: not sent again
        chat_server.reset()
        chat_server.script = [Paused(Answer("never"), at=0, pause_s=3.0)] * 2
        fresh = {**body, "messages": [{"role": "user", "content": "Another question."}]}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            answer = await raw.post("/v1/chat/completions", json=fresh)
        assert answer.status_code == 504
        assert "no first byte within 300ms" in answer.json()["error"]["message"]


async def _read_stream(raw: Any, body: Any, into: list[bytes]) -> None:
    async with raw.stream("POST", "/v1/chat/completions", json=body) as response:
        async for piece in response.aiter_raw():
            into.append(piece)


async def test_a_conversations_idle_time_is_in_ms_and_the_old_seconds_warn() -> None:
    """Every duration of the proxy is in milliseconds (``drain_ms``,
    ``conversation_idle_ms``); ``conversation_idle_s`` still works until 0.3, warning."""
    made = ModelProxy(Harness(), "http://127.0.0.1:9", conversation_idle_ms=90_000)
    assert made.conversations.idle_s == 90
    await made.aclose()
    with pytest.warns(DeprecationWarning, match="write conversation_idle_ms=120000"):
        old = ModelProxy(Harness(), "http://127.0.0.1:9", conversation_idle_s=120)
    assert old.conversations.idle_s == 120
    await old.aclose()


def test_the_cli_takes_the_idle_time_in_ms_and_says_the_seconds_flag_is_going(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from guardstack.cli.main import _idle_ms, _parser

    common = ["model-proxy", "--upstream", "http://127.0.0.1:9"]
    assert _idle_ms(_parser().parse_args(common)) == 3_600_000
    assert _idle_ms(_parser().parse_args([*common, "--conversation-idle-ms", "5000"])) == 5_000
    assert capsys.readouterr().err == ""
    assert _idle_ms(_parser().parse_args([*common, "--conversation-idle-s", "7"])) == 7_000
    assert "write --conversation-idle-ms 7000" in capsys.readouterr().err
