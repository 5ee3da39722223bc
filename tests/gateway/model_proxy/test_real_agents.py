"""The real coding agents behind ``guardstack model-proxy``: Claude Code, Codex CLI and
Gemini CLI from the npm registry (``tests/integrations/clients.py``), unpatched, in front
of the proxy run as a user runs it, in front of a loopback upstream that plays a runaway
model (``tests/integrations/runaway.py``: the same shell call again and again, every
request logged). Each test states one behaviour a user of that client sees."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.model_proxy.command import Running, started
from tests.integrations import clients
from tests.integrations.runaway import Runaway

KEY = "sk-a-client-key-0123456789"


@pytest.fixture(scope="module")
def installed() -> Path:
    """The pinned clients, installed into the cache once (a failure fails the tests)."""
    return clients.install()


@pytest.fixture
def upstream() -> Iterator[Runaway]:
    with Runaway(bound=40) as running:
        yield running


def proxy(
    tmp_path: Path, upstream: Runaway, config: str, *extra: str
) -> contextlib.AbstractContextManager[Running]:
    path = tmp_path / "guards.yaml"
    path.write_text(config, "utf-8")
    return started(["--config", str(path), "--upstream", upstream.url, *extra], tmp_path)


CAP_4 = "- name: tool-call-limit\n  config: {per_turn: 4}\n"


def shell_runs_claude(ran: clients.Ran) -> int:
    """How many Bash commands Claude Code ran (its stream-json tool results)."""
    return sum(
        1
        for event in ran.events()
        if event.get("type") == "user"
        for block in event.get("message", {}).get("content", [])
        if isinstance(block, dict) and block.get("type") == "tool_result"
    )


def shell_runs_codex(ran: clients.Ran) -> int:
    return sum(
        1
        for event in ran.events()
        if event.get("type") == "item.completed"
        and event.get("item", {}).get("type") == "command_execution"
    )


def claude_result(ran: clients.Ran) -> str:
    [result] = [event for event in ran.events() if event.get("type") == "result"]
    return str(result.get("result"))


def codex_said(ran: clients.Ran) -> str:
    return " ".join(
        str(event["item"].get("text"))
        for event in ran.events()
        if event.get("type") == "item.completed"
        and event.get("item", {}).get("type") == "agent_message"
    )


# -- Claude Code ------------------------------------------------------------------------


def test_claude_code_with_its_default_model_runs_n_commands_under_a_cap_of_n(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    """Reported: its default model's first request (``system`` items inside
    ``messages``) was refused with a 400 and Claude Code exited 1; and a cap of N let
    N+1 commands run. Now the cap is decided on the answer that asks for the fifth."""
    with clients.folder(tmp_path, "work") as home, proxy(tmp_path, upstream, CAP_4) as running:
        ran = clients.claude("List the files here.", base_url=running.url, key=KEY, home=home)
    first = upstream.model_requests()[0].body
    assert any(m.get("role") == "system" for m in first["messages"])  # the default model's
    assert ran.returncode == 0, ran.stderr
    assert shell_runs_claude(ran) == 4
    assert claude_result(ran).startswith("Stopped by tool-call-limit: tool call limit reached")
    assert upstream.calls_made == 5  # the fifth answer asked; it never ran


def test_two_claude_code_runs_of_one_prompt_never_share_counts(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    """Reported: the second ``claude -p`` of a prompt was stopped after one call by the
    first run's counts. Each run is its own conversation (its session id)."""
    with proxy(tmp_path, upstream, CAP_4) as running:
        runs = []
        for number in range(2):
            with clients.folder(tmp_path, f"run{number}") as home:
                runs.append(
                    clients.claude("List the files here.", base_url=running.url, key=KEY, home=home)
                )
    assert [shell_runs_claude(ran) for ran in runs] == [4, 4]


def test_claude_code_sees_a_loop_reminder_then_is_stopped(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    with (
        clients.folder(tmp_path, "work") as home,
        proxy(tmp_path, upstream, "- name: loop-detector\n") as running,
    ):
        ran = clients.claude("List the files here.", base_url=running.url, key=KEY, home=home)
    assert claude_result(ran).startswith("Stopped by loop-detector")
    reminded = [s for s in upstream.model_requests() if "Potential loop detected" in s.text()]
    assert reminded  # the reminder reached the model inside a later request
    assert shell_runs_claude(ran) < 8


def test_claude_code_s_token_count_and_start_probe_are_answered(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    import httpx

    with proxy(tmp_path, upstream, "[]\n") as running:
        head = httpx.head(running.url)
        counted = httpx.post(
            f"{running.url}/v1/messages/count_tokens",
            json={"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        )
    assert head.status_code == 200
    assert counted.json() == {"input_tokens": 42}
    [seen] = [s for s in upstream.requests if s.path.endswith("/count_tokens")]
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert "x-api-key" not in seen.headers or seen.headers["x-api-key"] != KEY


# -- Codex CLI -------------------------------------------------------------------------


def test_codex_loops_are_seen_through_its_chunk_ids_and_wall_times(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    """Reported: every result of Codex's shell starts ``Chunk ID: <random>`` and
    ``Wall time: …``, and the loop detector never fired in 25 identical ``ls``."""
    with (
        clients.folder(tmp_path, "work") as home,
        proxy(tmp_path, upstream, "- name: loop-detector\n") as running,
    ):
        ran = clients.codex("List the files here.", base_url=running.url, key=KEY, home=home)
    outputs = [
        item.get("output")
        for seen in upstream.model_requests()
        for item in seen.body.get("input", [])
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert any(str(output).startswith("Chunk ID: ") for output in outputs)
    assert "Stopped by loop-detector" in codex_said(ran)
    assert shell_runs_codex(ran) < 8
    assert any("Potential loop detected" in s.text() for s in upstream.model_requests())


def test_two_codex_runs_of_one_prompt_never_share_counts(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    with proxy(tmp_path, upstream, CAP_4) as running:
        runs = []
        for number in range(2):
            with clients.folder(tmp_path, f"run{number}") as home:
                runs.append(
                    clients.codex("List the files here.", base_url=running.url, key=KEY, home=home)
                )
    assert [shell_runs_codex(ran) for ran in runs] == [4, 4]
    assert all("Stopped by tool-call-limit" in codex_said(ran) for ran in runs)


def test_an_upstream_that_always_fails_is_an_error_to_codex_never_a_caps_stop(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    """Reported: with every request failing, Codex was told ``Stopped by
    model-call-limit … 30 model calls`` and exited 0 — "the agent looped" when no call
    worked. And its own retries multiplied the proxy's: every resend is now an attempt
    of one operation, within the stack's ``retry {attempts: 2}``."""
    upstream.fail = 500
    config = (
        "- name: retry\n  config: {stage: model, attempts: 2, backoff_ms: 1}\n"
        "- name: model-call-limit\n  config: {per_turn: 30}\n"
    )
    with clients.folder(tmp_path, "work") as home, proxy(tmp_path, upstream, config) as running:
        ran = clients.codex(
            "List the files here.", base_url=running.url, key=KEY, home=home, timeout_s=90
        )
    assert "Stopped by" not in ran.stdout
    assert len(upstream.model_requests()) <= 2  # however often Codex resent it
    errors = [e for e in ran.events() if e.get("type") in ("error", "turn.failed")]
    assert errors, ran.stdout[-2000:]


# -- Gemini CLI -------------------------------------------------------------------------


def test_gemini_cli_connects_and_runs_n_commands_under_a_cap_of_n(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    """Reported: Gemini CLI speaks only the Gemini API and got 404s. Now the proxy
    speaks it (``:streamGenerateContent?alt=sse``, the key in ``x-goog-api-key``)."""
    with clients.folder(tmp_path, "work") as home, proxy(tmp_path, upstream, CAP_4) as running:
        ran = clients.gemini("List the files here.", base_url=running.url, key=KEY, home=home)
    answer = json.loads(ran.stdout[ran.stdout.index("{") :])
    assert answer["response"].startswith("Stopped by tool-call-limit")
    assert answer["stats"]["tools"]["totalCalls"] == 4
    streamed = [s for s in upstream.model_requests() if "streamGenerateContent" in s.path]
    assert streamed
    assert all(s.headers.get("x-goog-api-key") != KEY for s in upstream.requests)


# -- a spent budget -----------------------------------------------------------------------

SPENT = """\
keys:
  sk-a-client-key-0123456789: {tenant: acme, team: ci, name: agent}
tenants:
  acme:
    teams: {ci: {budget: {usd_per_day: 0}}}
"""


@pytest.mark.parametrize("client", ["claude", "codex", "gemini"])
def test_a_spent_budget_ends_the_real_clients_run(
    installed: Path, upstream: Runaway, tmp_path: Path, client: str
) -> None:
    """Reported (#64): with a team's day spent the proxy answered 429 with a day's
    ``Retry-After``; agents slept through it or retried at once for hours. Now the
    budget's stop is the model's last words: each client ends its run at once, having
    sent at most one more request, and nothing reaches the upstream."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(SPENT, "utf-8")
    log = tmp_path / "requests.jsonl"
    extra = ["--tenants", str(tenants), "--request-log", str(log)]
    with (
        clients.folder(tmp_path, "work") as home,
        proxy(tmp_path, upstream, "[]\n", *extra) as running,
    ):
        started_at = time.monotonic()
        if client == "claude":
            ran = clients.claude("List the files here.", base_url=running.url, key=KEY, home=home)
        elif client == "codex":
            ran = clients.codex("List the files here.", base_url=running.url, key=KEY, home=home)
        else:
            ran = clients.gemini("List the files here.", base_url=running.url, key=KEY, home=home)
        took_s = time.monotonic() - started_at
    lines = [json.loads(line) for line in log.read_text("utf-8").splitlines()]
    # the stop, at most one more request — and a client's side call that asked for JSON
    # (Gemini CLI's model router) is stopped with a 400 it does not retry
    answered = [line for line in lines if line["status"] == 200]
    assert 1 <= len(answered) <= 2, lines
    assert all(line["stopped"] == "budgets" for line in lines)
    assert all(line["status"] in (200, 400) for line in lines)
    assert took_s < 60, took_s  # never asleep on a Retry-After, never retrying for long
    assert upstream.model_requests() == []  # nothing forwarded
    if client == "claude":
        said = claude_result(ran)
    elif client == "codex":
        said = codex_said(ran)
    else:
        said = json.loads(ran.stdout[ran.stdout.index("{") :])["response"]
    assert "Stopped by budgets: team 'acme/ci' has used $0.00 of its $0.00 this day" in said


def test_claude_code_codex_and_gemini_cli_share_one_routed_gateway(
    installed: Path, tmp_path: Path
) -> None:
    """One gateway process, one ledger, three providers (#63): Claude Code's Messages go
    to its upstream, Codex's Responses to another, Gemini CLI's to a third — each
    reaching its own and no other — and the spend of all three is in one report."""
    import httpx

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "keys:\n  sk-a-client-key-0123456789: {tenant: acme, team: dev, name: agent}\n"
        "tenants:\n  acme: {teams: {dev: {}}}\n",
        "utf-8",
    )
    with (
        Runaway(bound=2) as messages,
        Runaway(bound=2) as responses,
        Runaway(bound=2) as gemini,
        clients.folder(tmp_path, "work") as home,
    ):
        arguments = ["--tenants", str(tenants), "--admin-key-env", "ADMIN",
                     "--upstream", f"anthropic={messages.url}",
                     "--upstream", f"openai={responses.url}",
                     "--upstream", f"google={gemini.url}",
                     "--route", "messages=anthropic", "--route", "responses=openai",
                     "--route", "gemini=google"]  # fmt: skip
        admin = "an-admin-key-of-some-length"
        with started(arguments, tmp_path, environment={"ADMIN": admin}) as running:
            said = {
                "claude": clients.claude("List the files.", base_url=running.url, key=KEY,
                                         home=home),
                "codex": clients.codex("List the files.", base_url=running.url, key=KEY,
                                       home=home),
                "gemini": clients.gemini("List the files.", base_url=running.url, key=KEY,
                                         home=home),
            }  # fmt: skip
            report = httpx.get(
                f"{running.url}/admin/spend",
                params={"scope": "tenant:acme", "by": "model"},
                headers={"authorization": f"Bearer {admin}"},
            ).json()
        paths = {
            "messages": {seen.path.split("?")[0] for seen in messages.model_requests()},
            "responses": {seen.path.split("?")[0] for seen in responses.model_requests()},
            "gemini": {seen.path.split(":")[0] for seen in gemini.model_requests()},
        }
    assert all(ran.returncode == 0 for ran in said.values()), {
        name: ran.stderr[-500:] for name, ran in said.items()
    }
    assert paths["messages"] == {"/v1/messages"}
    assert paths["responses"] == {"/v1/responses"}
    assert paths["gemini"]
    assert all(path.startswith("/v1beta/models/") for path in paths["gemini"])
    assert len(report["rows"]) >= 3  # a model of each client's, in one report
    assert report["spent_usd"] >= 0


WRAP_UP = """\
keys:
  sk-a-client-key-0123456789: {tenant: acme, team: ci, name: agent}
tenants:
  acme:
    teams: {ci: {budget: {usd_per_day: 0.3, on_limit: wrap_up, wrap_up_tokens: 300}}}
prices: {house-model: [3, 15]}
"""


def test_a_budget_that_wraps_up_ends_claude_codes_run_with_the_models_answer(
    installed: Path, upstream: Runaway, tmp_path: Path
) -> None:
    """Reported (#64): with ``on_limit: wrap_up`` behind the proxy, a real agent's
    requests went upstream with their tools until a refusal, and the run never ended.
    Now the request that would pass the day goes once more without tools, inside
    ``wrap_up_tokens``, and Claude Code ends its run with that answer."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(WRAP_UP, "utf-8")
    with (
        clients.folder(tmp_path, "work") as home,
        proxy(tmp_path, upstream, "[]\n", "--tenants", str(tenants)) as running,
    ):
        ran = clients.claude("List the files here.", base_url=running.url, key=KEY, home=home)
    sent = upstream.model_requests()
    assert ran.returncode == 0, ran.stderr
    last = sent[-1].body
    assert "tools" not in last  # the wrap-up: its tools withheld
    assert last["max_tokens"] == 300
    assert "say what you did" in json.dumps(last)
    assert claude_result(ran) == "Done."  # the model's own last answer ends the run
