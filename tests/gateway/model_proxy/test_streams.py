"""Spend that matches the invoice: a stream is charged exactly as the same answer
unstreamed, whatever its chunking — recorded streams in each provider's documented
shapes (``tests/fixtures/streams/``), through the proxy's reading of them, through
the whole proxy with budgets, and through the adapters on both anyio backends."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.gateway.model_proxy.gemini import GEMINI
from guardstack.gateway.model_proxy.responses import RESPONSES
from guardstack.gateway.model_proxy.upstream import stream_usage
from guardstack.gateway.model_proxy.wires import ANTHROPIC, OPENAI
from guardstack.gateway.tenants import tenants_of
from guardstack.guards.usage_costs import cost_of
from guardstack.pipeline import Harness, Usage
from tests.integrations.stream_server import FIXTURES, Recorded, manifest

RECORDED = manifest()
WIRES: dict[str, Any] = {
    "openai": OPENAI, "anthropic": ANTHROPIC, "responses": RESPONSES, "gemini": GEMINI,
}  # fmt: skip
#: Input, output, cache read, cache write, per million tokens: each priced apart.
PRICE = (3.0, 15.0, 0.3, 3.75)


def expected(name: str) -> Usage:
    return Usage(**RECORDED[name]["usage"])


def twin_usage(name: str) -> Usage | None:
    wire = WIRES[RECORDED[name]["wire"]]
    return wire.reply_of((FIXTURES / f"{name}.json").read_bytes()).usage  # type: ignore[no-any-return]


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(edges)]


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_each_recording_reports_what_its_provider_bills(name: str) -> None:
    """The twin, read as the proxy reads an unstreamed answer, is the usage the
    provider bills (input with its cache reads and writes, output with its reasoning)."""
    assert twin_usage(name) == expected(name)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(RECORDED)), cuts=st.lists(st.integers(1, 20_000), max_size=60))
def test_a_stream_is_charged_as_its_twin_however_it_is_cut(name: str, cuts: list[int]) -> None:
    data = (FIXTURES / f"{name}.sse").read_bytes()
    streamed = stream_usage(WIRES[RECORDED[name]["wire"]], cut(data, cuts))
    assert streamed == twin_usage(name) == expected(name)
    assert streamed is not None
    assert cost_of(streamed, PRICE) == cost_of(expected(name), PRICE)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_stream_read_a_byte_at_a_time_is_charged_as_its_twin(name: str) -> None:
    data = (FIXTURES / f"{name}.sse").read_bytes()
    pieces = [data[i : i + 1] for i in range(len(data))]
    assert stream_usage(WIRES[RECORDED[name]["wire"]], pieces) == expected(name)


def test_a_stream_that_never_says_its_usage_is_charged_its_reservation() -> None:
    data = (FIXTURES / "chat-usage-chunk.sse").read_bytes()
    without = b"".join(
        line + b"\n\n" for line in data.split(b"\n\n") if line and b'"usage":{' not in line
    )
    assert stream_usage(OPENAI, [without]) is None  # unknown: the reservation stays charged


# -- through the whole proxy, with budgets -----------------------------------------------

ALICE, BOB = "sk-acme-alice-0123456789", "sk-acme-bob-000123456789"


def tenants(names: list[str]) -> Any:
    """Two keys; every recording's own model priced (and the requested one cheaper, so
    pricing a stream at the model asked for instead of the one that answered shows)."""
    models = {RECORDED_MODELS[name]: list(PRICE) for name in names}
    return tenants_of({
        "keys": {ALICE: {"tenant": "acme", "name": "alice"},
                 BOB: {"tenant": "acme", "name": "bob"}},
        "tenants": {"acme": {}},
        "prices": {"m": [0.1, 0.1], **models},
    })  # fmt: skip


def _model_of(name: str) -> str:
    import json

    twin = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))
    return str(twin.get("model") or twin.get("modelVersion"))


RECORDED_MODELS = {name: _model_of(name) for name in RECORDED}


def request(wire: str, stream: bool) -> tuple[str, dict[str, Any]]:
    ask = [{"role": "user", "content": "How is the build?"}]
    if wire == "openai":
        return "/v1/chat/completions", {"model": "m", "max_tokens": 100, "messages": ask,
                                        "stream": stream}  # fmt: skip
    if wire == "anthropic":
        return "/v1/messages", {"model": "m", "max_tokens": 100, "messages": ask,
                                "stream": stream}  # fmt: skip
    if wire == "responses":
        return "/v1/responses", {"model": "m", "max_output_tokens": 100,
                                 "input": "How is the build?", "stream": stream}  # fmt: skip
    verb = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/v1beta/models/m:{verb}", {
        "contents": [{"role": "user", "parts": [{"text": "How is the build?"}]}],
        "generationConfig": {"maxOutputTokens": 100},
    }


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the proxy is served by uvicorn, on asyncio


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    with Recorded() as upstream:
        yield upstream


@pytest.mark.parametrize("name", sorted(RECORDED))
async def test_through_the_proxy_a_stream_costs_what_its_twin_costs(
    name: str, recorded: Recorded
) -> None:
    """Alice asks streamed (cut at random places), Bob the same unstreamed: the ledger
    holds the same dollars and tokens for both — at the answering model's price."""
    from tests.gateway.model_proxy.test_app import serve

    class Upstream:
        base_url = recorded.url

    recorded.name = name
    size = len(recorded.stream_bytes())
    recorded.cuts = random.Random(name).sample(range(1, size), min(40, size - 1))
    wire = RECORDED[name]["wire"]
    async for served in serve(Harness(), Upstream(), tenants=tenants([name])):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            for key, stream in ((ALICE, True), (BOB, False)):
                path, body = request(wire, stream)
                headers = {"authorization": f"Bearer {key}", "x-goog-api-key": key}
                async with raw.stream("POST", path, json=body, headers=headers) as answer:
                    assert answer.status_code == 200, await answer.aread()
                    await answer.aread()
        assert served.proxy.budgets is not None
        report = await served.proxy.budgets.spend("tenant:acme", "day", "key")
    rows = {row["name"]: row for row in report["rows"]}
    assert rows["acme/alice"]["tokens"] == rows["acme/bob"]["tokens"] == expected(name).total_tokens
    assert rows["acme/alice"]["spent_usd"] == pytest.approx(rows["acme/bob"]["spent_usd"])
    assert rows["acme/alice"]["spent_usd"] == pytest.approx(cost_of(expected(name), PRICE))


# -- through the adapters, on both backends -------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("name", [n for n in sorted(RECORDED) if RECORDED[n]["wire"] == "openai"])
def test_the_openai_adapter_charges_a_stream_as_its_twin(
    name: str, backend: str, recorded: Recorded
) -> None:
    import anyio
    from openai import AsyncOpenAI

    from guardstack.integrations.openai import OpenAIChatModel

    recorded.name = name
    recorded.cuts = random.Random(name).sample(range(1, 2_000), 50)

    async def usage_of(stream: bool) -> Usage | None:
        client = AsyncOpenAI(base_url=f"{recorded.url}/v1", api_key="k", max_retries=0)
        async with client:
            model = OpenAIChatModel(client, "m", stream=stream)
            reply = await model.complete([{"role": "user", "content": "hi"}], [])
        return reply.usage

    streamed = anyio.run(usage_of, True, backend=backend)
    whole = anyio.run(usage_of, False, backend=backend)
    assert streamed == whole == expected(name)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    "name", [n for n in sorted(RECORDED) if RECORDED[n]["wire"] == "anthropic"]
)
def test_the_anthropic_adapter_charges_a_stream_as_its_twin(
    name: str, backend: str, recorded: Recorded
) -> None:
    import anyio
    from anthropic import AsyncAnthropic

    from guardstack.integrations.anthropic import AnthropicModel

    recorded.name = name
    recorded.cuts = random.Random(name).sample(range(1, 3_000), 60)

    async def usage_of(stream: bool) -> Usage | None:
        client = AsyncAnthropic(base_url=recorded.url, api_key="k", max_retries=0)
        async with client:
            model = AnthropicModel(client, "m", max_tokens=100, stream=stream)
            reply = await model.complete([{"role": "user", "content": "hi"}], [])
        return reply.usage

    streamed = anyio.run(usage_of, True, backend=backend)
    whole = anyio.run(usage_of, False, backend=backend)
    assert streamed == whole == expected(name)


@pytest.mark.parametrize(
    ("cut_after", "charged"),
    [
        (0, "its reservation"),  # accepted, cut before the first event reached the client
        (5, "what it reported"),  # cut after message_delta's usage, before message_stop
    ],
)
async def test_a_cut_stream_is_charged_what_may_have_been_billed(
    cut_after: int, charged: str
) -> None:
    """Reported: a stream the upstream accepted and cut before its first event was
    charged nothing (the reservation given back); one cut after its usage arrived was
    charged its reservation, not the larger usage the upstream reported."""
    import httpx

    from guardstack.gateway.tenants import tenants_of
    from tests.gateway.model_proxy.test_app import serve
    from tests.gateway.model_proxy.test_request import auth, request_for
    from tests.integrations.runaway import Runaway

    key, admin = "sk-acme-cut-0123456789ab", "an-admin-key-of-some-length"
    day = {"budget": {"tokens_per_day": 100_000}}
    tenants = tenants_of({"keys": {key: {"tenant": "acme", "name": "bot"}},
                          "tenants": {"acme": day}})  # fmt: skip
    with Runaway(bound=0, usage=(100, 50)) as upstream:
        upstream.cut_after = cut_after
        async for served in serve(Harness(), upstream, tenants=tenants, admin_key=admin):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                path, body = request_for("messages", "hi", stream=True)
                async with raw.stream("POST", path, json=body, headers=auth("messages", key)) as r:
                    async for _ in r.aiter_raw():
                        pass
                report = await raw.get("/admin/spend", params={"scope": "tenant:acme"},
                                       headers={"authorization": f"Bearer {admin}"})  # fmt: skip
    [row] = report.json()["rows"]
    assert row["requests"] == 1
    if charged == "its reservation":
        assert 50 < row["tokens"] < 150  # the estimate: its input and max_tokens 50
    else:
        assert row["tokens"] == 150  # 100 in, 50 out: what the upstream reported
