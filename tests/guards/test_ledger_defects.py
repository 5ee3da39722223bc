"""The caps' promises where production puts them, one test per defect users met (each
failed before the ledger): parallel children, eviction, shared-store races, durable
decisions, stores that are not ledgers (virtual time, both backends)."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from guardstack.guards import Approval, ModelCallLimit, ToolCallLimit, UsageLimit
from guardstack.pipeline import (
    AgentTool,
    ApprovalMismatch,
    Approve,
    ConfigError,
    GuardstackWarning,
    Harness,
    MemoryStore,
    ModelReply,
    Reject,
    ScriptedModel,
    Session,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    ToolResultEvent,
    Usage,
)
from guardstack.pipeline.contract import Window, store_key
from guardstack.wrappers import AdaptiveConcurrencyLimit, RateLimit

PRICES = {"m": (0.0, 1.0)}  # $1 per million output tokens


class Child:
    """One $0.25 reply (250,000 output tokens), after a second: its ``max_tokens`` says
    exactly that, so its reservation is its cost."""

    model = "m"
    max_tokens = 250_000

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        await anyio.sleep(1)
        return ModelReply("notes", usage=Usage(0, 250_000), model="m")


class Planner:
    """Starts ten children in one step, then sums up. It states ``max_tokens=100``."""

    model = "m"
    max_tokens = 100

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        if any(m["role"] == "tool" for m in messages):
            return ModelReply("summary", usage=Usage(), model="m")
        calls = [ToolCallRequest(f"research_{n}", {"task": "look"}, f"c{n}") for n in range(10)]
        return ModelReply(tool_calls=calls, usage=Usage(), model="m")


def planner(limit: UsageLimit, store: MemoryStore | None = None) -> Harness:
    parent = Harness(Planner(), max_parallel_tool_calls=10, store=store)
    for n in range(10):
        parent.tools.register(
            AgentTool(f"research_{n}", lambda: Harness(Child()), description="Research.")
        )
    parent.plugin(limit)
    return parent


async def test_ten_parallel_children_never_spend_past_a_session_cap() -> None:
    """Reported: $3.40 against $1.00 (checked before, charged after, never reserved)."""
    agent = planner(UsageLimit(usd_per_session=1.00, prices=PRICES)).loop.create("tree")
    await agent.prompt("plan")
    spent = agent.usage.output_tokens / 1_000_000
    assert spent <= 1.00  # each reservation was its cost: no overshoot at all
    assert spent == 1.00  # four children got in, and the cap was used
    stopped = [
        e.result for e in agent.session.events if isinstance(e, ToolResultEvent) and e.result.code
    ]
    assert len(stopped) == 6
    assert "this session cost $1.0000 and the limit is $1.0000" in stopped[0].content


async def test_a_child_reserves_at_its_own_limit_in_the_parents_day_window() -> None:
    """Reported: costed at the *parent's* max_tokens (100), ten $0.25 children passed a
    $1.00 day ($2.50)."""
    store = MemoryStore()
    limit = UsageLimit(usd_per_day=1.00, prices=PRICES, tenant="acme")
    agent = planner(limit, store).loop.create("tree")
    await agent.prompt("plan")
    assert agent.usage.output_tokens / 1_000_000 == 1.00
    day = store_key("usage-limit", "tenant", "acme", "usd", f"day:{_today(store)}")
    assert await store.balance(Window(day, "usd")) == pytest.approx(1.00)


def _today(store: MemoryStore) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(store.wall_clock(), tz=datetime.UTC).strftime("%Y-%m-%d")


async def test_a_full_memory_store_never_forgets_a_sessions_count() -> None:
    """Reported: ModelCallLimit(per_session=3) allowed 5 calls once the store was full."""
    store = MemoryStore(max_keys=5)
    harness = Harness(ScriptedModel([ModelReply("ok")] * 20), store=store)
    harness.plugin(ModelCallLimit(per_session=3))
    harness.plugin(RateLimit(per_second=1_000, stage="model", key="all"))
    capped = harness.loop.create("capped")
    assert (await capped.prompt("one")).reason == "completed"
    for index in range(20):  # other traffic fills the soft state past its bound
        await store.add(store_key("filler", "counter", str(index)), 1)
    assert (await capped.prompt("two")).reason == "completed"
    assert (await capped.prompt("three")).reason == "completed"
    blocked = await capped.prompt("four")
    assert blocked.reason == "blocked"
    assert blocked.error == (
        "model-call-limit: this session made 3 model calls and the limit is 3 per session"
    )


class SuspendingStore(MemoryStore):
    """A memory store whose every operation suspends, as a shared one does."""

    name = "shared"

    async def take(self, *args: Any, **kwargs: Any) -> float:
        await anyio.lowlevel.checkpoint()
        return await super().take(*args, **kwargs)


async def test_a_rate_limit_queue_on_a_shared_store_loses_no_waiter() -> None:
    """Reported: a queue race raised KeyError, reported as a store failure; with
    on_error="closed" it refused 2 of 20 calls with the store healthy."""
    store = SuspendingStore(on_error="closed")
    harness = Harness(store=store)

    async def work(arguments: Any, call: ToolCall) -> str:
        return "ok"

    harness.tools.register(ToolDefinition("work", work))
    harness.plugin(RateLimit(per_second=100, burst=1))
    codes: list[str | None] = []

    async def one(n: int) -> None:
        outcome = await harness.tools.execute(ToolCall("work", {}, f"c{n}", conversation="x"))
        codes.append(outcome.result.code)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", GuardstackWarning)  # a store failure would warn
        async with anyio.create_task_group() as group:
            for n in range(20):
                group.start_soon(one, n)
    assert codes == [None] * 20


async def test_an_adaptive_limit_reads_the_tool_it_is_asked_about() -> None:
    """Reported: current("search") returned the limit of web:search."""
    limit = AdaptiveConcurrencyLimit(initial=4, min=1, max=8)
    harness = Harness()

    async def busy(arguments: Any, call: ToolCall) -> Any:
        from guardstack.pipeline import TOOL_RATE_LIMITED, ToolError, ToolResult

        return ToolResult("Error: slow down", True, ToolError("slow", "R", TOOL_RATE_LIMITED))

    harness.tools.register(ToolDefinition("web:search", busy))
    harness.plugin(limit)
    await harness.tools.execute(ToolCall("web:search", {}, "c", conversation="x"))
    assert limit.current("web:search") == 2  # halved by the overload
    assert limit.current("search") == 4  # never used: its initial limit


async def test_a_tool_named_like_another_entry_keeps_its_own_limit() -> None:
    """Reported: a tool named report:limit shared report's key (its pinned limit of 1
    failed open to 4)."""
    harness = Harness()
    running: dict[str, int] = {"report": 0, "report:limit": 0}
    most: dict[str, int] = {"report": 0, "report:limit": 0}

    def tool(name: str) -> ToolDefinition:
        async def run(arguments: Any, call: ToolCall) -> str:
            running[name] += 1
            most[name] = max(most[name], running[name])
            await anyio.sleep(1)
            running[name] -= 1
            return "ok"

        return ToolDefinition(name, run)

    harness.tools.register(tool("report"))
    harness.tools.register(tool("report:limit"))
    harness.plugin(AdaptiveConcurrencyLimit(initial=1, min=1, max=1))
    async with anyio.create_task_group() as group:
        for n in range(4):
            for name in running:
                call = ToolCall(name, {}, f"{name}{n}", conversation="x")
                group.start_soon(run_one, harness, call)
    assert most == {"report": 1, "report:limit": 1}


async def run_one(harness: Harness, call: ToolCall) -> None:
    await harness.tools.execute(call)


def test_caps_refuse_a_store_that_keeps_no_ledger_when_built() -> None:
    """Reported: ModelCallLimit and UsageLimit accepted any store= and failed at run time."""

    class SoftOnly:
        name = "soft"
        on_error = None

    for build in (
        lambda: ModelCallLimit(per_turn=1, store=SoftOnly()),  # type: ignore[arg-type]
        lambda: UsageLimit(tokens_per_turn=1, store=SoftOnly()),  # type: ignore[arg-type]
        lambda: ToolCallLimit(per_turn=1, store=SoftOnly()),  # type: ignore[arg-type]
        lambda: ModelCallLimit(per_turn=1, store=object()),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError, match="keeps a ledger"):
            build()


# -- durable decisions --------------------------------------------------------------------


ran: list[dict[str, Any]] = []


async def _deploy(arguments: Any, call: ToolCall) -> str:
    ran.append(dict(arguments))
    return "deployed"


def approving() -> Harness:
    model = ScriptedModel(
        [
            ModelReply(tool_calls=[ToolCallRequest("deploy", {"region": "prod-us"}, "d1")]),
            ModelReply("done"),
        ]
    )
    harness = Harness(model)
    harness.tools.register(ToolDefinition("deploy", _deploy))
    harness.plugin(Approval(require=("deploy",)))
    return harness


async def test_a_log_edited_after_the_request_runs_nothing() -> None:
    """Reported: edit the saved log's arguments and the edited call ran (prod-eu)."""
    ran.clear()
    agent = approving().loop.create("s")
    paused = await agent.prompt("ship")
    [pending] = paused.pending
    log = agent.session.to_jsonl()
    edited = log.replace("prod-us", "prod-eu", 1)  # the model's call, before the request
    assert log.index("prod-us") < log.index("approval/request")
    tampered = approving().loop.create("s", session=Session.from_jsonl(edited))
    with pytest.raises(ApprovalMismatch, match="not the call the person was asked about"):
        await tampered.resume({"d1": Approve(digest=pending.digest)})
    with pytest.raises(ApprovalMismatch, match="not the call the person was asked about"):
        await tampered.resume({"d1": Approve()})  # no digest given: the request's is checked
    assert ran == []


async def test_a_call_already_decided_cannot_be_decided_again() -> None:
    """Reported: a Reject after an Approve was accepted and silently dropped."""
    ran.clear()
    model = ScriptedModel(
        [
            ModelReply(
                tool_calls=[
                    ToolCallRequest("deploy", {"region": "a"}, "d1"),
                    ToolCallRequest("deploy", {"region": "b"}, "d2"),
                ]
            ),
            ModelReply("done"),
        ]
    )
    harness = Harness(model)
    harness.tools.register(ToolDefinition("deploy", _deploy))
    harness.plugin(Approval(require=("deploy",)))
    agent = harness.loop.create("s")
    await agent.prompt("ship")
    still = await agent.resume({"d1": Approve(by="ops")})  # d2 undecided: nothing runs yet
    assert still.reason == "approval"
    with pytest.raises(ApprovalMismatch, match=r"'d1' was already decided \(approve by ops\)"):
        await agent.resume({"d1": Reject("changed my mind"), "d2": Approve()})
    assert ran == []
    assert (await agent.resume({"d2": Approve()})).reason == "completed"
    assert ran == [{"region": "a"}, {"region": "b"}]
