"""Approval: the original's third decision, a person's decision in process and durably,
and the order it stands in (virtual time, both backends)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from guardstack.guards import Approval, LoopDetector, ToolCallLimit
from guardstack.pipeline import (
    TOOL_DENIED,
    TOOL_REJECTED,
    Allow,
    ApprovalDecision,
    ApprovalMismatch,
    Approve,
    Ask,
    Edit,
    Harness,
    ModelReply,
    PendingApproval,
    Reject,
    ScriptedModel,
    Session,
    ToolCall,
    ToolCallEvent,
    ToolCallRequest,
    ToolDefinition,
    ToolResultEvent,
    TurnEnd,
    call_digest,
)
from tests.wrappers.otel import MetricRig, SpanRig

ran: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture(autouse=True)
def _fresh() -> None:
    ran.clear()


def deploy_tool(name: str = "deploy", **options: Any) -> ToolDefinition:
    async def run(arguments: Any, call: ToolCall) -> str:
        ran.append((name, dict(arguments)))
        return f"{name} ok"

    return ToolDefinition(name, run, **options)


class Steps:
    """A model that makes the given steps, then answers; it keeps every request."""

    def __init__(self, *steps: list[ToolCallRequest]) -> None:
        self.steps = list(steps)
        self.requests: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
        self.requests.append(messages)
        made = sum(1 for m in messages if m["role"] == "assistant")
        if made < len(self.steps):
            return ModelReply(tool_calls=tuple(self.steps[made]))
        return ModelReply("done")


def deploy(target: str = "prod", call_id: str = "c1") -> ToolCallRequest:
    return ToolCallRequest("deploy", {"target": target}, call_id)


def harness(model: Any, *plugins: Any, tools: tuple[str, ...] = ("deploy",)) -> Harness:
    built = Harness(model)
    for name in tools:
        built.tools.register(deploy_tool(name))
    for plugin in plugins:
        built.plugin(plugin)
    return built


def results(agent: Any) -> list[ToolResultEvent]:
    return [e for e in agent.session.events if isinstance(e, ToolResultEvent)]


# -- the original's third decision -----------------------------------------------------


async def test_an_ask_with_no_approval_service_is_denied_with_the_originals_text() -> None:
    built = harness(None)

    async def asks(call: ToolCall, call_next: Any) -> Any:
        return Ask()

    built.tools.pre_execute.use(asks)
    outcome = await built.tools.execute(ToolCall("deploy", {}, "c", conversation="x"))
    assert outcome.result.content == 'Error: tool "deploy" requires approval (not yet supported)'
    assert outcome.result.code == TOOL_DENIED
    assert ran == []


async def test_an_ask_from_any_layer_is_resolved_by_approval() -> None:
    asked: list[PendingApproval] = []

    async def person(pending: PendingApproval) -> Approve:
        asked.append(pending)
        return Approve(by="ops")

    built = harness(None)

    async def asks(call: ToolCall, call_next: Any) -> Any:
        decision = await call_next(call)
        return Ask("deploys are reviewed") if isinstance(decision, Allow) else decision

    built.plugin(Approval(approver=person))  # its policy asks about nothing here
    built.tools.pre_execute.use(asks)  # inside it: its Ask comes back through it
    outcome = await built.tools.execute(ToolCall("deploy", {"v": 1}, "c", conversation="x"))
    assert outcome.result.content == "deploy ok"
    assert [p.reason for p in asked] == ["deploys are reviewed"]
    assert asked[0].digest == call_digest("deploy", {"v": 1})


# -- in process --------------------------------------------------------------------------


async def test_approve_reject_and_edit_in_process() -> None:
    decisions = iter(
        [Approve(by="ana"), Reject("not on a Friday", by="bo"), Edit({"target": "staging"})]
    )

    async def person(pending: PendingApproval) -> Any:
        return next(decisions)

    model = Steps([deploy(call_id="a")], [deploy(call_id="b")], [deploy(call_id="c")])
    agent = harness(model, Approval(require=("deploy",), approver=person)).loop.create("s")
    result = await agent.prompt("ship it")
    assert result.reason == "completed"
    assert ran == [("deploy", {"target": "prod"}), ("deploy", {"target": "staging"})]
    rejected = results(agent)[1].result
    assert rejected.code == TOOL_REJECTED
    assert rejected.content == "Error: rejected: not on a Friday"
    logged = [e for e in agent.session.events if isinstance(e, ApprovalDecision)]
    assert [(e.decision, e.by) for e in logged] == [
        ("approve", "ana"),
        ("reject", "bo"),
        ("edit", None),
    ]
    assert logged[2].arguments_json == '{"target":"staging"}'  # the person's version
    calls = [e for e in agent.session.events if isinstance(e, ToolCallEvent)]
    assert calls[2].arguments == {"target": "prod"}  # the model's version


async def test_a_silent_approver_times_out_into_a_rejection_or_a_pause() -> None:
    async def never(pending: PendingApproval) -> Approve:
        await anyio.sleep(3600)
        return Approve()

    rejecting = Approval(require=("deploy",), approver=never, timeout_ms=30_000)
    agent = harness(Steps([deploy()]), rejecting).loop.create("s")
    started = anyio.current_time()
    await agent.prompt("go")
    assert anyio.current_time() - started == 30.0
    assert results(agent)[0].result.content == "Error: rejected: no decision within 30000 ms"

    pausing = Approval(require=("deploy",), approver=never, timeout_ms=30_000, on_timeout="pause")
    agent = harness(Steps([deploy()]), pausing).loop.create("s")
    result = await agent.prompt("go")
    assert result.reason == "approval"
    assert [p.call_id for p in result.pending] == ["c1"]


async def test_parallel_calls_are_asked_together_and_run_as_each_is_decided() -> None:
    asked_at: dict[str, float] = {}
    ran_at: dict[str, float] = {}
    thinking = {"a": 3.0, "b": 1.0, "c": 2.0}

    async def person(pending: PendingApproval) -> Approve:
        asked_at[pending.call_id] = anyio.current_time()
        await anyio.sleep(thinking[pending.call_id])
        return Approve()

    built = Harness(Steps([deploy(call_id=c) for c in "abc"]), max_parallel_tool_calls=3)

    async def run(arguments: Any, call: ToolCall) -> str:
        ran_at[call.call_id] = anyio.current_time()
        return "ok"

    built.tools.register(ToolDefinition("deploy", run))
    built.plugin(Approval(require=("deploy",), approver=person))
    agent = built.loop.create("s")
    started = anyio.current_time()
    await agent.prompt("go")
    assert {c: t - started for c, t in asked_at.items()} == {"a": 0, "b": 0, "c": 0}
    assert {c: t - started for c, t in ran_at.items()} == thinking
    assert [e.call_id for e in results(agent)] == ["a", "b", "c"]  # logged in model order


# -- durably -----------------------------------------------------------------------------


async def test_the_durable_round_trip_gives_the_model_the_request_it_would_have_got(
    tmp_path: Path,
) -> None:
    steps = ([deploy(call_id="d1"), ToolCallRequest("status", {}, "s1")],)

    async def yes(pending: PendingApproval) -> Approve:
        return Approve()

    # the same conversation, decided in process
    live_model = Steps(*steps)
    live = harness(
        live_model, Approval(require=("deploy",), approver=yes), tools=("deploy", "status")
    )
    await live.loop.create("s").prompt("ship it")
    ran.clear()

    paused_model = Steps(*steps)
    built = harness(paused_model, Approval(require=("deploy",)), tools=("deploy", "status"))
    agent = built.loop.create("s")
    result = await agent.prompt("ship it")
    assert result.reason == "approval"
    [pending] = result.pending
    assert (pending.call_id, pending.tool, pending.arguments) == (
        "d1",
        "deploy",
        {"target": "prod"},
    )
    assert ran == [("status", {})]  # the other call of the step ran
    assert [e.type for e in agent.session.events][-5:] == [
        "tool/call",
        "approval/request",  # where d1's result will be
        "tool/call",
        "tool/result",
        "turn/end",
    ]
    path = tmp_path / "s.jsonl"
    agent.session.save(path)

    # "another process": a new harness and the log read back from disk
    later_model = Steps(*steps)
    later = harness(later_model, Approval(require=("deploy",)), tools=("deploy", "status"))
    resumed = later.loop.create("s", session=Session.load(path))
    assert [p.digest for p in resumed.pending] == [pending.digest]
    result = await resumed.resume({"d1": Approve(by="ana", digest=pending.digest)})
    assert result.reason == "completed"
    assert json.dumps(later_model.requests[0]) == json.dumps(live_model.requests[1])
    assert ran == [("status", {}), ("deploy", {"target": "prod"})]


async def test_undecided_calls_stay_pending_and_mismatches_change_nothing() -> None:
    model = Steps([deploy(call_id="a"), deploy("dev", call_id="b")])
    agent = harness(model, Approval(require=("deploy",))).loop.create("s")
    result = await agent.prompt("go")
    assert [p.call_id for p in result.pending] == ["a", "b"]
    with pytest.raises(ApprovalMismatch, match="other arguments"):
        await agent.resume({"a": Approve(digest=call_digest("deploy", {"target": "dev"}))})
    with pytest.raises(ApprovalMismatch, match="'zz' is not waiting"):
        await agent.resume({"zz": Approve()})
    assert ran == []
    result = await agent.resume({"b": Reject("dev is frozen")})
    assert result.reason == "approval"  # recorded; nothing runs until the step is decided
    assert [p.call_id for p in result.pending] == ["a"]
    assert ran == []
    again = Session.from_jsonl(agent.session.to_jsonl())  # the decision is in the log
    assert [p.call_id for p in harness(model).loop.create("s", session=again).pending] == ["a"]
    result = await agent.resume({"a": Approve()})
    assert result.reason == "completed"
    assert ran == [("deploy", {"target": "prod"})]
    # results in model order, as the step would have had them without the pause
    assert [r.call_id for r in results(agent)] == ["a", "b"]
    assert results(agent)[1].result.content == "Error: rejected: dev is frozen"


async def test_a_new_prompt_rejects_what_is_still_pending() -> None:
    model = Steps([deploy()])
    agent = harness(model, Approval(require=("deploy",))).loop.create("s")
    await agent.prompt("go")
    model.steps = []
    result = await agent.prompt("never mind")
    assert result.reason == "completed"
    [rejected] = results(agent)
    assert rejected.result.code == TOOL_REJECTED
    assert "a new prompt came before anyone decided on it" in rejected.result.content
    assert agent.pending == ()
    assert [e.reason for e in agent.session.events if isinstance(e, TurnEnd)] == [
        "approval",
        "aborted",
        "completed",
    ]


async def test_a_paused_turn_resumes_in_another_process(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, sys, anyio
        from guardstack.guards import Approval
        from guardstack.pipeline import Approve, Harness, ModelReply, Session, ToolCallRequest
        from guardstack.pipeline import ToolDefinition

        class Model:
            async def complete(self, messages, tools):
                if messages[-1]["role"] == "tool":
                    return ModelReply("deployed: " + messages[-1]["content"])
                return ModelReply(tool_calls=[ToolCallRequest("deploy", {"to": "prod"}, "c1")])

        async def deploy(arguments, call):
            return "shipped to " + arguments["to"]

        async def main(step, path):
            harness = Harness(Model())
            harness.tools.register(ToolDefinition("deploy", deploy, destructive=True))
            harness.plugin(Approval())
            if step == "pause":
                agent = harness.loop.create("s")
                result = await agent.prompt("ship")
                agent.session.save(path)
                print(result.reason, result.pending[0].digest)
            else:
                agent = harness.loop.create("s", session=Session.load(path))
                result = await agent.resume({"c1": Approve(by="ops")})
                print(result.reason, result.text)

        anyio.run(main, sys.argv[1], sys.argv[2])
        """
    )
    path = str(tmp_path / "s.jsonl")

    def run(step: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script, step, path],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()

    paused = run("pause")
    assert paused == f"approval {call_digest('deploy', {'to': 'prod'})}"
    assert run("resume") == "completed deployed: shipped to prod"


# -- order ------------------------------------------------------------------------------


async def test_a_cap_before_approval_denies_first_and_nobody_is_asked() -> None:
    asked: list[str] = []

    async def person(pending: PendingApproval) -> Approve:
        asked.append(pending.call_id)
        return Approve()

    model = Steps([deploy(call_id="a")], [deploy(call_id="b")])
    cap_first = harness(
        model, ToolCallLimit(per_turn=1), Approval(require=("deploy",), approver=person)
    )
    await cap_first.loop.create("s").prompt("go")
    assert asked == ["a"]  # b was over the cap: denied before anyone was asked

    asked.clear()
    model = Steps([deploy(call_id="a")], [deploy(call_id="b")])
    person_first = harness(
        model, Approval(require=("deploy",), approver=person), ToolCallLimit(per_turn=1)
    )
    agent = person_first.loop.create("s")
    await agent.prompt("go")
    assert asked == ["a", "b"]  # asked about b, which the cap then refused
    assert results(agent)[1].result.code == TOOL_DENIED


async def test_a_resumed_call_is_not_counted_twice_by_a_cap_before_approval() -> None:
    model = Steps([deploy(call_id="a")], [deploy(call_id="b")])
    agent = harness(model, ToolCallLimit(per_turn=2), Approval(require=("deploy",))).loop.create(
        "s"
    )
    await agent.prompt("go")
    result = await agent.resume({"a": Approve()})
    assert result.reason == "approval"  # b is the second call of the turn: allowed, asked
    result = await agent.resume({"b": Approve()})
    assert result.reason == "completed"
    assert [name for name, _ in ran] == ["deploy", "deploy"]


async def test_destructive_tools_need_approval_unless_allowed() -> None:
    built = Harness()
    built.tools.register(deploy_tool("drop_table", destructive=True))
    built.tools.register(deploy_tool("read", destructive=False))
    built.plugin(Approval())
    outcome = await built.tools.execute(ToolCall("drop_table", {}, "c", conversation="x"))
    assert outcome.pending is not None
    outcome = await built.tools.execute(ToolCall("read", {}, "c", conversation="x"))
    assert outcome.result.content == "read ok"

    allowed = Harness()
    allowed.tools.register(deploy_tool("drop_table", destructive=True))
    allowed.plugin(Approval(allow=("drop_*",)))
    outcome = await allowed.tools.execute(ToolCall("drop_table", {}, "c", conversation="x"))
    assert outcome.result.content == "drop_table ok"


async def test_a_loop_guard_before_approval_stops_a_loop_without_asking() -> None:
    asked: list[str] = []

    async def person(pending: PendingApproval) -> Approve:
        asked.append(pending.call_id)
        return Approve()

    model = Steps(*([deploy(call_id=f"c{n}")] for n in range(8)))
    built = harness(
        model,
        LoopDetector(identical=2, remind=1, deny=2),
        Approval(require=("deploy",), approver=person),
    )
    agent = built.loop.create("s")
    await agent.prompt("go")
    denied = [r.call_id for r in results(agent) if r.result.code == TOOL_DENIED]
    assert denied
    assert not set(denied) & set(asked)


# -- telemetry and config ----------------------------------------------------------------


async def test_a_decision_is_a_span_event_and_a_metric() -> None:
    from guardstack.wrappers import Tracing

    spans, meters = SpanRig(), MetricRig()

    async def person(pending: PendingApproval) -> Reject:
        await anyio.sleep(2)
        return Reject("no", by="ana")

    built = harness(Steps([deploy()]))
    built.plugin(Tracing(spans.provider))
    built.plugin(Approval(require=("deploy",), approver=person, meter_provider=meters.provider))
    await built.loop.create("s").prompt("go")
    [tool_span] = [s for s in spans.spans if s.name == "execute_tool deploy"]
    [event] = [e for e in tool_span.events if e.name == "guardstack.approval"]
    assert dict(event.attributes or {}) == {
        "gen_ai.tool.name": "deploy",
        "gen_ai.tool.call.id": "c1",
        "guardstack.approval.decision": "reject",
        "guardstack.approval.wait_s": 2.0,
        "guardstack.approval.by": "ana",
        "guardstack.approval.reason": "no",
    }
    assert meters.total("guardstack.approvals", **{"guardstack.approval.decision": "reject"}) == 1


def test_bad_configuration_names_the_key() -> None:
    from guardstack.pipeline import ConfigError

    with pytest.raises(ConfigError, match="on_timeout"):
        Approval(on_timeout="wait")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="require"):
        Approval(require=(1,))
    with pytest.raises(ConfigError, match="timeout_ms"):
        Approval(timeout_ms=0)


# -- the property ----------------------------------------------------------------------

from hypothesis import event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

step_strategy = st.lists(
    st.tuples(st.sampled_from(["deploy", "read"]), st.integers(0, 2)), min_size=1, max_size=3
)


@settings(max_examples=80)
@given(
    steps=st.lists(step_strategy, max_size=5),
    order=st.permutations(["cap", "loop", "approval"]),
    durable=st.booleans(),
    parallel=st.sampled_from([1, 3]),
    choices=st.lists(st.sampled_from(["approve", "reject", "edit"]), min_size=1, max_size=20),
    reload=st.booleans(),
    cap=st.integers(1, 6),
)
async def test_no_call_runs_without_a_matching_decision(
    steps: list[list[tuple[str, int]]],
    order: list[str],
    durable: bool,
    parallel: int,
    choices: list[str],
    reload: bool,
    cap: int,
) -> None:
    executed: list[tuple[str, dict[str, Any]]] = []
    asked: list[str] = []
    given_decisions: dict[str, Any] = {}
    picks = iter(choices * 40)

    def choose(pending: PendingApproval) -> Any:
        asked.append(pending.call_id)
        kind = next(picks)
        decision: Any = (
            Approve()
            if kind == "approve"
            else Reject("no")
            if kind == "reject"
            else Edit({"v": -1})
        )
        given_decisions[pending.call_id] = decision
        return decision

    async def approver(pending: PendingApproval) -> Any:
        await anyio.sleep(0.5)
        return choose(pending)

    requests = [
        [ToolCallRequest(name, {"v": v}, f"t{n}-{i}") for i, (name, v) in enumerate(step)]
        for n, step in enumerate(steps)
    ]

    def build() -> Harness:
        built = Harness(Steps(*requests), max_parallel_tool_calls=parallel)
        for name in ("deploy", "read"):

            async def run(arguments: Any, call: ToolCall, name: str = name) -> str:
                executed.append((call.call_id, dict(arguments)))
                return f"{name} {arguments['v']}"

            built.tools.register(ToolDefinition(name, run))
        plugins: dict[str, ToolCallLimit | LoopDetector | Approval] = {
            "cap": ToolCallLimit(per_turn=cap),
            "loop": LoopDetector(identical=2, remind=1, deny=2),
            "approval": Approval(require=("deploy",), approver=None if durable else approver),
        }
        for name in order:
            built.plugin(plugins[name])
        return built

    built = build()
    agent = built.loop.create("s")
    result = await agent.prompt("go")
    rounds = 0
    while result.reason == "approval":
        rounds += 1
        assert rounds < 60
        if reload:  # "another process": the log read back, a new harness
            built = build()
            agent = built.loop.create("s", session=Session.from_jsonl(agent.session.to_jsonl()))
        # decide some of what is pending (at least one), as a person would
        pending = agent.pending
        decide = pending[: max(1, len(pending) // 2)]
        result = await agent.resume({p.call_id: choose(p) for p in decide})

    events = agent.session.events
    event(f"rounds={min(rounds, 3)} asked={min(len(asked), 3)} ran={min(len(executed), 3)}")
    deploy_ids = {e.call_id for e in events if isinstance(e, ToolCallEvent) and e.name == "deploy"}
    for call_id, arguments in executed:
        if call_id in deploy_ids:
            decision = given_decisions.get(call_id)
            assert isinstance(decision, Approve | Edit), call_id  # never without a yes
            if isinstance(decision, Edit):
                assert arguments == {"v": -1}
    ran_ids = {call_id for call_id, _ in executed}
    rejected = {c for c, d in given_decisions.items() if isinstance(d, Reject)}
    assert not rejected & ran_ids  # a rejected call never reaches dispatch
    answered = [e.call_id for e in events if isinstance(e, ToolResultEvent)]
    called = [e.call_id for e in events if isinstance(e, ToolCallEvent)]
    assert sorted(answered) == sorted(called)
    assert len(set(answered)) == len(answered)  # every call answered exactly once
    denied_by_cap = {
        e.call_id
        for e in events
        if isinstance(e, ToolResultEvent) and "tool call limit reached" in e.result.content
    }
    if order.index("cap") < order.index("approval"):
        assert not denied_by_cap & set(asked)  # nobody asked about what the cap refused


# -- agent trees -------------------------------------------------------------------------


def release_tree() -> Harness:
    from guardstack.pipeline import AgentTool

    def operator() -> Harness:
        return harness(Steps([deploy(call_id="c1")]), Approval(require=("deploy",)))

    parent = Harness(Steps([ToolCallRequest("ops", {"task": "deploy prod"}, "p1")]))
    parent.tools.register(AgentTool("ops", operator, description="Operations."))
    return parent


@pytest.mark.parametrize("reload", [False, True], ids=["same-agent", "reloaded"])
async def test_a_child_that_pauses_pauses_its_parent_and_resume_routes_down(
    reload: bool, tmp_path: Path
) -> None:
    agent = release_tree().loop.create("p")
    result = await agent.prompt("release")
    assert result.reason == "approval"
    [waiting] = result.pending
    assert (waiting.call_id, waiting.tool) == ("p/ops/1#c1", "deploy")
    with pytest.raises(ApprovalMismatch, match="waits for its child agent's calls"):
        await agent.resume({"p1": Approve()})
    if reload:
        path = tmp_path / "p.jsonl"
        agent.session.save(path)
        agent = release_tree().loop.create("p", session=Session.load(path))
        assert [p.call_id for p in agent.pending] == ["p/ops/1#c1"]
    result = await agent.resume({"p/ops/1#c1": Approve(digest=waiting.digest)})
    assert result.reason == "completed"
    assert ran == [("deploy", {"target": "prod"})]
    [answer] = results(agent)
    assert answer.child_session == "p/ops/1"
    assert answer.result.content == "done"  # the child's final text
    child = agent.session.children["p/ops/1"]
    assert [e.reason for e in child.events if isinstance(e, TurnEnd)] == ["approval", "completed"]


async def test_a_turn_resumed_in_a_new_process_keeps_its_tool_call_count() -> None:
    steps = (
        [ToolCallRequest("read", {}, "r1")],
        [deploy(call_id="d1")],
        [ToolCallRequest("read", {"n": 2}, "r2")],
        [ToolCallRequest("read", {"n": 3}, "r3")],
    )

    def build() -> Harness:
        return harness(
            Steps(*steps),
            ToolCallLimit(per_turn=3),
            Approval(require=("deploy",)),
            tools=("deploy", "read"),
        )

    agent = build().loop.create("s")
    await agent.prompt("go")  # r1 ran, d1 waits: two of the turn's three calls
    again = build().loop.create("s", session=Session.from_jsonl(agent.session.to_jsonl()))
    await again.resume({"d1": Approve()})
    codes = [e.result.code for e in results(again)]
    assert codes == [None, None, None, TOOL_DENIED]  # r2 is the third call, r3 one too many


async def test_a_turn_resumed_in_a_new_process_counts_none_of_an_earlier_turns_calls() -> None:
    """The log is read back to the turn's start and no further: the first turn's call is
    not one of the second turn's three."""

    def build(*replies: ModelReply) -> Harness:
        return harness(
            ScriptedModel(list(replies)),
            ToolCallLimit(per_turn=3),
            Approval(require=("deploy",)),
            tools=("deploy", "read"),
        )

    def asks(*requests: ToolCallRequest) -> ModelReply:
        return ModelReply(tool_calls=requests)

    agent = build(
        asks(ToolCallRequest("read", {}, "r0")),
        ModelReply("first"),
        asks(ToolCallRequest("read", {}, "r1")),
        asks(deploy(call_id="d1")),
    ).loop.create("s")
    await agent.prompt("one")  # r0, in a turn of its own
    await agent.prompt("two")  # r1 ran, d1 waits: two of this turn's three calls
    again = build(
        asks(ToolCallRequest("read", {"n": 2}, "r2")),
        asks(ToolCallRequest("read", {"n": 3}, "r3")),
        ModelReply("done"),
    ).loop.create("s", session=Session.from_jsonl(agent.session.to_jsonl()))
    await again.resume({"d1": Approve()})
    codes = {e.call_id: e.result.code for e in results(again)}
    assert codes == {"r0": None, "r1": None, "d1": None, "r2": None, "r3": TOOL_DENIED}
