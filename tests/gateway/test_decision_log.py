"""What operators see of a gateway: the decision log (a file, standard error or nowhere,
and its last lines at ``/admin/decisions``), stops a machine can tell
(``--stop-as error``), and the stop, spend and remaining-budget metrics — behind the
model proxy, against a loopback upstream."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from guardstack.gateway.decision_log import DecisionLog
from guardstack.gateway.tenants import tenants_of
from guardstack.guards import ModelCallLimit
from guardstack.pipeline import Harness
from guardstack.pipeline.decisions import decided
from guardstack.wrappers import Metrics
from tests.gateway.model_proxy.test_app import serve
from tests.gateway.test_budgets import ADMIN, ALICE, CI, TENANTS, ask, post
from tests.integrations.runaway import Runaway
from tests.wrappers.otel import MetricRig


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[DecisionLog]:
    kept = DecisionLog(str(tmp_path / "decisions.jsonl")).attach()
    try:
        yield kept
    finally:
        kept.detach()


def test_lines_go_to_a_file_and_the_last_thousand_are_kept(tmp_path: Path) -> None:
    kept = DecisionLog(str(tmp_path / "logs" / "d.jsonl"), keep=3).attach()
    try:
        for number in range(5):
            decided("deny", layer="x", decision="deny", reason=f"r{number}")
    finally:
        kept.detach()
    written = (tmp_path / "logs" / "d.jsonl").read_text("utf-8").splitlines()
    assert [json.loads(line)["reason"] for line in written] == [f"r{n}" for n in range(5)]
    assert [line["reason"] for line in kept.since(0)] == ["r2", "r3", "r4"]
    middle = kept.recent[1]["ts"]
    assert [line["reason"] for line in kept.since(middle)] == [
        line["reason"] for line in kept.recent if line["ts"] > middle
    ]


def test_off_writes_nothing_and_still_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    kept = DecisionLog("off").attach()
    try:
        decided("stop", layer="x", decision="end_turn")
    finally:
        kept.detach()
    assert capsys.readouterr().err == ""
    assert len(kept.since(0)) == 1


def test_a_stream_that_fails_loses_the_line_not_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("disk full")

    monkeypatch.setattr("sys.stderr", Broken())
    monkeypatch.setattr(logging, "raiseExceptions", False)
    kept = DecisionLog("-").attach()
    try:
        decided("stop", layer="x", decision="end_turn")  # never raises
    finally:
        kept.detach()
    assert len(kept.recent) == 1


async def turn(raw: httpx.AsyncClient, key: str, steps: int, **more: Any) -> list[httpx.Response]:
    """One agent turn over chat completions: each answer's tool call is answered and
    the conversation sent again, ``steps`` times."""
    tools = [{"type": "function", "function": {"name": "run", "parameters": {}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the build"}]
    answers = []
    for _ in range(steps):
        answer = await raw.post(
            "/v1/chat/completions",
            json={"model": "gpt-x", "max_tokens": 50, "messages": messages, "tools": tools},
            headers={"authorization": f"Bearer {key}", **more},
        )
        answers.append(answer)
        if answer.status_code != 200:
            break
        message = answer.json()["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if not calls:
            break
        messages = [*messages, message]
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    return answers


@pytest.mark.parametrize("stop_as", ["answer", "error"])
async def test_a_guards_stop_is_logged_counted_and_answered_as_asked(
    stop_as: str, log: DecisionLog
) -> None:
    rig = MetricRig()
    harness = Harness()
    harness.plugin(Metrics(rig.provider))
    harness.plugin(ModelCallLimit(per_turn=2))
    with Runaway(bound=10, usage=(5, 50), tool="run") as runaway:
        async for served in serve(
            harness, runaway, tenants=tenants_of(TENANTS), admin_key=ADMIN,
            decision_log=log, stop_as=stop_as,
        ):  # fmt: skip
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                answers = await turn(raw, ALICE, 5)
                shown = await raw.get(
                    "/admin/decisions?since=0", headers={"authorization": f"Bearer {ADMIN}"}
                )
    stop = answers[-1]
    assert [answer.status_code for answer in answers[:-1]] == [200, 200]
    assert stop.headers["x-guardstack-stopped"] == "model-call-limit"
    if stop_as == "error":
        assert stop.status_code == 429  # a limit: the API's rate-limit status
        assert "model-call-limit" in stop.json()["error"]["message"]
        assert stop.headers["x-should-retry"] == "false"
    else:
        assert stop.status_code == 200
        assert stop.json()["choices"][0]["finish_reason"] == "stop"
    [line] = [d for d in shown.json()["decisions"] if d["event"] == "stop"]
    assert (line["layer"], line["tenant"], line["team"], line["key_name"]) == (
        "model-call-limit",
        "acme",
        "research",
        "acme/alice",
    )
    assert ALICE not in shown.text
    assert "fix the build" not in shown.text  # nothing a message said
    assert rig.total("guardstack.stops", layer="model-call-limit", tenant="acme") == 1


async def test_refusals_and_admin_actions_are_lines_and_never_a_key(log: DecisionLog) -> None:
    admin = {"authorization": f"Bearer {ADMIN}"}
    with Runaway(bound=0, usage=(5, 50)) as runaway:
        async for served in serve(
            Harness(), runaway, tenants=tenants_of(TENANTS), admin_key=ADMIN,
            decision_log=log,
        ):  # fmt: skip
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                issued = await raw.post("/admin/keys", json={"tenant": "acme"}, headers=admin)
                await raw.put("/admin/budgets/tenant:acme", json={"usd_per_day": 2}, headers=admin)
                await post(raw, ALICE, ask("hi", model="gpt-z"))  # not on the allow-list
                for _ in range(5):  # ci's day is $0.006: the fourth is refused
                    await post(raw, CI, ask("again"))
                await raw.delete(f"/admin/keys/{issued.json()['id']}", headers=admin)
                shown = await raw.get("/admin/decisions?since=0", headers=admin)
                unauthorised = await raw.get("/admin/decisions")
    events = [(d["event"], d["decision"]) for d in shown.json()["decisions"]]
    assert events[:3] == [
        ("admin", "issue_key"),
        ("admin", "set_budget"),
        ("refuse", "model_not_allowed"),
    ]
    assert events.count(("budget_refused", "refuse")) == 2
    assert events[-1] == ("admin", "revoke_key")
    refused = next(d for d in shown.json()["decisions"] if d["event"] == "budget_refused")
    assert refused["reason"].startswith("team 'acme/ci' has used $0.0046 of its $0.0060 this day")
    for secret in (ALICE, CI, issued.json()["key"]):
        assert secret not in shown.text
    assert unauthorised.status_code == 401
    file_lines = Path(log.target).read_text("utf-8").splitlines()
    assert len(file_lines) == len(events)


async def test_spend_and_what_is_left_reach_the_metrics() -> None:
    rig = MetricRig()
    harness = Harness()
    harness.plugin(Metrics(rig.provider))
    with Runaway(bound=0, usage=(5, 50)) as runaway:
        async for served in serve(harness, runaway, tenants=tenants_of(TENANTS), admin_key=ADMIN):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                for _ in range(2):
                    assert (await post(raw, CI, ask("one"))).status_code == 200
    # $10 a million in, $30 out: 5 in and 50 out cost $0.00155 each
    assert rig.total(
        "guardstack.spend.usd", tenant="acme", team="ci", key="acme/ci", model="gpt-x"
    ) == pytest.approx(2 * 0.00155)
    left = {
        (point.attributes["scope"], point.attributes["window"]): point.value
        for point in rig.points("guardstack.budget.remaining.usd")
    }
    # read after the first request (then at most once a second)
    assert left[("team:acme/ci", "usd_per_day")] == pytest.approx(0.006 - 0.00155)
    assert left[("tenant:acme", "usd_per_day")] == pytest.approx(1.0 - 0.00155)
    assert not any(scope.startswith("conversation:") for scope, _ in left)
    # the proxy's own time on each, as its x-guardstack-overhead-ms header says
    assert rig.total("guardstack.proxy.overhead", wire="openai") == 2


async def test_control_behind_the_proxy_acts_on_the_tools_the_clients_models_call(
    log: DecisionLog,
) -> None:
    """Reported: ``pause`` behind the model proxy answered "no tool 'run'; the tools are
    none". Its tools are the ones the clients' models call: a paused one is stopped
    with the operator's reason; ``force_open`` without a breaker says what it needs."""
    admin = {"authorization": f"Bearer {ADMIN}"}
    with Runaway(bound=10, usage=(5, 50), tool="run") as runaway:
        async for served in serve(
            Harness(), runaway, tenants=tenants_of(TENANTS), admin_key=ADMIN,
            decision_log=log,
        ):  # fmt: skip
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                paused = await raw.post(
                    "/admin/control",
                    json={"action": "pause", "tool": "run", "reason": "incident 42"},
                    headers=admin,
                )
                forced = await raw.post(
                    "/admin/control", json={"action": "force_open", "tool": "run"}, headers=admin
                )
                [stopped] = await turn(raw, ALICE, 3)
    assert paused.status_code == 200
    assert forced.status_code == 400
    assert forced.json()["error"] == {
        "type": "invalid_request",
        "message": "control: this stack has no circuit-breaker to force (the tools are the "
        "ones the clients' models call; add circuit-breaker to the stack to force theirs)",
    }
    assert stopped.headers["x-guardstack-stopped"] == "control"
    content = stopped.json()["choices"][0]["message"]["content"]
    assert content == 'Stopped by control: tool "run" is paused: incident 42'
    decisions = [(d["event"], d["layer"], d["decision"]) for d in log.since(0)]
    assert decisions == [
        ("admin", "admin", "pause"),
        ("deny", "control", "deny"),
        ("stop", "control", "end_turn"),
    ]


async def test_a_stop_decided_on_an_answer_is_the_apis_error_when_asked(log: DecisionLog) -> None:
    """``--stop-as error`` also covers a stop the proxy decides on the calls an answer
    asks for (a cap on tool calls): 429, the stop's text, the layer in the header."""
    from guardstack.guards import ToolCallLimit

    harness = Harness()
    harness.plugin(ToolCallLimit(per_turn=1, on_exceeded="end_turn"))
    with Runaway(bound=10, usage=(5, 50), tool="run") as runaway:
        async for served in serve(
            harness, runaway, tenants=tenants_of(TENANTS), admin_key=ADMIN,
            decision_log=log, stop_as="error",
        ):  # fmt: skip
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                answers = await turn(raw, ALICE, 4)
    assert [answer.status_code for answer in answers] == [200, 429]
    stop = answers[-1]
    assert stop.headers["x-guardstack-stopped"] == "tool-call-limit"
    assert stop.json()["error"]["message"].startswith("Stopped by tool-call-limit: tool call")
    assert [d["event"] for d in log.since(0)] == ["deny", "stop"]
