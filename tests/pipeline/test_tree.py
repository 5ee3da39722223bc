"""Trees of agents (``AgentTool``): one budget, one deadline, one linked log — virtual
time, both backends. The last test is the property over random trees."""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.guards import AgentLimit, ToolCallLimit, TurnDeadline, UsageLimit
from guardstack.pipeline import (
    AGENT_STOPPED,
    TOOL_DENIED,
    AgentTool,
    AssistantMessage,
    GuardstackWarning,
    Harness,
    Session,
    ToolCallEvent,
    ToolCallRequest,
    ToolResultEvent,
    TurnEnd,
    Usage,
    tool,
)
from guardstack.wrappers import Tracing
from tests.pipeline.trees import Plan, calls, ran, tool_results, worker
from tests.wrappers.otel import SpanRig


@pytest.fixture(autouse=True)
def _fresh_runs() -> None:
    ran.clear()


# -- tool calls ----------------------------------------------------------------------


async def test_a_childs_tool_calls_count_against_the_parents_tool_call_limit() -> None:
    parent = Harness(Plan([calls("research")]))
    parent.tools.register(
        AgentTool(
            "research",
            worker([[ToolCallRequest("search", {"q": str(n)})] for n in range(5)]),
            description="Research.",
        )
    )
    parent.plugin(ToolCallLimit(per_turn=4))
    agent = parent.loop.create("p")
    result = await agent.prompt("go")
    assert result.reason == "completed"
    assert ran == ["search"] * 3  # 4 in the parent's turn: its own research call, 3 searches
    [child] = agent.session.children.values()
    denied = [e.result for e in tool_results(child) if e.result.code == TOOL_DENIED]
    assert len(denied) == 2
    assert "tool call limit reached: this turn already made 4 tool calls" in denied[0].content


async def test_a_child_counts_in_its_ancestors_caps_as_they_are_when_it_calls() -> None:
    """The ancestors' caps are read at each call, not copied at adoption: a reload of the
    parent's stack while its child runs binds the child's next calls."""
    parent = Harness(Plan([calls("research")]))

    @tool
    async def tighten() -> str:
        """Reload the parent's stack with a cap of 2 calls a turn."""
        parent.reload([{"name": "tool-call-limit", "config": {"per_turn": 2}}])
        return "tightened"

    def build() -> Harness:
        searches = [[ToolCallRequest("search", {"q": str(n)})] for n in range(3)]
        child: Harness = worker([[ToolCallRequest("tighten", {})], *searches])()
        child.tools.register(tighten)
        return child

    parent.tools.register(AgentTool("research", build, description="Research."))
    parent.reload([{"name": "tool-call-limit", "config": {"per_turn": 10}}])
    agent = parent.loop.create("p")
    result = await agent.prompt("go")
    assert result.reason == "completed"
    [child] = agent.session.children.values()
    codes = [e.result.code for e in tool_results(child)]
    # tighten runs under the cap of 10; the new cap of 2 binds the searches after it (a
    # copy taken at adoption would have kept 10 and let all three run), and counts on in
    # the turn: research and tighten made its 2 calls already
    assert codes == [None, TOOL_DENIED, TOOL_DENIED, TOOL_DENIED]
    assert ran == []


async def test_a_call_the_childs_own_layers_deny_is_given_back_to_the_parent() -> None:
    steps = [
        [ToolCallRequest("search", {"q": "a"})],
        [ToolCallRequest("search", {"q": "b"})],
        [ToolCallRequest("fetch", {})],
    ]
    parent = Harness(Plan([calls("research")]))
    own = ToolCallLimit(per_tool={"search": 1})
    parent.tools.register(AgentTool("research", worker(steps, own), description="Research."))
    parent.plugin(ToolCallLimit(per_turn=3))
    agent = parent.loop.create("p")
    await agent.prompt("go")
    # research + search + fetch = 3: the search the child's own cap denied was not charged
    assert ran == ["search", "fetch"]


# -- the tree's shape ----------------------------------------------------------------


def recursive(*plugins: Any) -> Harness:
    """An agent whose every agent delegates once more (one shared harness)."""
    harness = Harness(Plan([calls("delegate")], "deepest answer"))
    harness.tools.register(AgentTool("delegate", harness, description="Delegate."))
    for plugin in plugins:
        harness.plugin(plugin)
    return harness


async def test_max_depth_refuses_the_child_that_would_be_too_deep() -> None:
    agent = recursive(AgentLimit(max_depth=3)).loop.create("root")
    result = await agent.prompt("go")
    assert result.reason == "completed"
    middle = agent.session.children["root/delegate/1"]
    deepest = middle.children["root/delegate/1/delegate/1"]
    assert not deepest.children
    [refused] = tool_results(deepest)
    assert refused.result.code == AGENT_STOPPED
    assert "depth 4 and the limit is max_depth=3" in refused.result.content


async def test_max_children_is_per_agent_per_turn() -> None:
    parent = Harness(Plan([calls("research", "research", "research")]))
    parent.tools.register(AgentTool("research", worker([]), description="Research."))
    parent.plugin(AgentLimit(max_children=2))
    agent = parent.loop.create("p")
    await agent.prompt("go")
    codes = [e.result.code for e in tool_results(agent)]
    assert codes == [None, None, AGENT_STOPPED]
    assert "started 2 child agents this turn" in tool_results(agent)[2].result.content
    agent.model = Plan([calls("research")])
    await agent.prompt("again")  # a new turn: two more allowed
    assert tool_results(agent)[-1].result.code is None
    assert sorted(agent.session.children) == ["p/research/1", "p/research/2", "p/research/3"]


async def test_max_agents_counts_the_children_of_every_agent_below_it() -> None:
    parent = Harness(Plan([calls("research"), calls("research")]))
    parent.tools.register(AgentTool("research", worker([]), description="Research."))
    parent.plugin(AgentLimit(max_agents=2))
    agent = parent.loop.create("p")  # 1
    await agent.prompt("go")  # the first child is 2, the second is refused
    assert [e.result.code for e in tool_results(agent)] == [None, AGENT_STOPPED]
    assert "total agent cap (2)" in tool_results(agent)[1].result.content


# -- spend ---------------------------------------------------------------------------


async def test_a_grandchilds_spend_reaches_the_root() -> None:
    ten = Usage(0, 10_000)
    leaf = worker([], usage=ten)
    middle_steps = [calls("deeper")]

    def middle() -> Harness:
        harness = Harness(Plan(middle_steps, "middle answer", usage=ten))
        harness.tools.register(AgentTool("deeper", leaf, description="Deeper."))
        return harness

    root = Harness(Plan([calls("research")], usage=ten))
    root.tools.register(AgentTool("research", middle, description="Research."))
    root.plugin(UsageLimit(tokens_per_turn=25_000))
    agent = root.loop.create("r")
    result = await agent.prompt("go")
    # root 10k, middle 10k, then the leaf's call sees 20k < 25k and runs (30k); the
    # middle's next call is refused by the root's cap, and the root's own too
    assert result.usage == Usage(0, 30_000)
    assert result.reason == "blocked"
    [middle_result] = tool_results(agent)
    assert middle_result.result.code == AGENT_STOPPED


async def test_parallel_children_share_what_is_left_fairly() -> None:
    quarter = Usage(0, 250_000)
    four = [[ToolCallRequest("search", {"q": str(n)})] for n in range(3)]
    parent = Harness(Plan([calls("research", "research")]), max_parallel_tool_calls=2)
    parent.tools.register(
        AgentTool("research", worker(four, usage=quarter, think_s=1.0), description="R.")
    )
    parent.plugin(UsageLimit(usd_per_session=1.0, prices={"m": (0.0, 1.0)}))
    agent = parent.loop.create("p")
    await agent.prompt("go")
    per_child = [
        sum(1 for e in child.events if e.type == "assistant/message")
        for child in agent.session.children.values()
    ]
    # neither starved (spend is reserved per call, never per child up front), and the
    # cap held to within the one call a sibling had in flight
    assert min(per_child) >= 2
    assert agent.usage.output_tokens <= 1_250_000


# -- time and cancellation -----------------------------------------------------------


async def test_cancelling_the_parent_cancels_the_child_and_both_logs_stay_whole() -> None:
    parent = Harness(Plan([calls("research")]))
    parent.tools.register(AgentTool("research", worker([], think_s=3600), description="Research."))
    agent = parent.loop.create("p")
    started = anyio.current_time()
    async with anyio.create_task_group() as group:
        group.start_soon(agent.prompt, "go")
        await anyio.sleep(5)
        agent.cancel()
    [child] = agent.session.children.values()
    assert [e.reason for e in child.events if isinstance(e, TurnEnd)] == ["aborted"]
    assert [e.reason for e in agent.session.events if isinstance(e, TurnEnd)] == ["aborted"]
    assert anyio.current_time() - started == 5


async def test_a_childs_own_shorter_deadline_stops_it_with_agent_stopped() -> None:
    parent = Harness(Plan([calls("research")]))
    child = worker([], TurnDeadline(ms=1_000), think_s=60)
    parent.tools.register(AgentTool("research", child, description="Research."))
    parent.plugin(TurnDeadline(ms=30_000))
    agent = parent.loop.create("p")
    started = anyio.current_time()
    result = await agent.prompt("go")
    assert result.reason == "completed"
    [answer] = tool_results(agent)
    assert answer.result.code == AGENT_STOPPED
    assert "stopped (deadline)" in answer.result.content
    assert anyio.current_time() - started == 1.0


# -- the log -------------------------------------------------------------------------


async def test_saved_logs_link_children_and_load_and_resume_rebuild_both(tmp_path: Any) -> None:
    parent = Harness(Plan([calls("research"), calls("research")], usage=Usage(1, 1)))
    parent.tools.register(AgentTool("research", worker([], usage=Usage(5, 5)), description="R."))
    agent = parent.loop.create("p/1")  # a slash in the id: the file name is quoted
    await agent.prompt("go")
    linked = [e.child_session for e in tool_results(agent)]
    assert linked == ["p/1/research/1", "p/1/research/2"]
    path = str(tmp_path / "run.jsonl")
    agent.session.save(path)
    assert sorted(os.listdir(tmp_path)) == [
        "run.jsonl",
        "run.p%2F1%2Fresearch%2F1.jsonl",
        "run.p%2F1%2Fresearch%2F2.jsonl",
    ]
    loaded = Session.load(path)
    assert sorted(loaded.children) == linked
    for child_id in loaded.children:
        assert loaded.children[child_id].to_jsonl() == agent.session.children[child_id].to_jsonl()
    assert loaded.usage() == agent.usage == Usage(13, 13)  # the children's rolled up
    resumed = parent.loop.create("p/1", session=loaded)
    resumed.model = Plan([calls("research")])
    await resumed.prompt("more")
    assert tool_results(resumed)[-1].child_session == "p/1/research/3"

    os.unlink(tmp_path / "run.p%2F1%2Fresearch%2F2.jsonl")
    with pytest.warns(GuardstackWarning, match="research/2"):
        partial = Session.load(path)
    assert list(partial.children) == ["p/1/research/1"]


async def test_a_recording_records_every_child_as_it_runs(tmp_path: Any) -> None:
    parent = Harness(Plan([calls("research")]))
    parent.tools.register(AgentTool("research", worker([calls("search", q="x")]), description="R."))
    agent = parent.loop.create("p")
    path = str(tmp_path / "live.jsonl")
    with agent.session.record(path):
        await agent.prompt("go")
        [child] = agent.session.children.values()
        on_disk = Session.load(path)
    assert on_disk.to_jsonl() == agent.session.to_jsonl()
    assert on_disk.children["p/research/1"].to_jsonl() == child.to_jsonl()


# -- what the model is told ----------------------------------------------------------


# -- telemetry -----------------------------------------------------------------------


async def test_the_childs_invoke_agent_span_is_under_the_parents_execute_tool_span() -> None:
    rig = SpanRig()
    parent = Harness(Plan([calls("research")]))
    parent.tools.register(
        AgentTool(
            "research", worker([], Tracing(rig.provider), usage=Usage(3, 4)), description="R."
        )
    )
    parent.plugin(Tracing(rig.provider))
    await parent.loop.create("p").prompt("go")
    spans = {span.name: span for span in rig.spans}
    parent_turn = dict(spans["invoke_agent p"].attributes or {})
    # the child's usage is rolled up into the parent's turn
    assert (
        parent_turn["gen_ai.usage.input_tokens"],
        parent_turn["gen_ai.usage.output_tokens"],
    ) == (3, 4)
    child_turn, tool_span = spans["invoke_agent p/research/1"], spans["execute_tool research"]
    assert child_turn.parent is not None
    assert child_turn.parent.span_id == tool_span.context.span_id
    assert len({span.context.trace_id for span in rig.spans}) == 1


# -- the property ----------------------------------------------------------------------


@attrs.frozen
class Node:
    steps: tuple[tuple[str, ...], ...]  # each step: "work" or the index of a child
    tokens: int
    think_s: float
    children: tuple[Node, ...]


def trees(depth: int = 0) -> st.SearchStrategy[Node]:
    children = st.just(()) if depth >= 2 else st.lists(trees(depth + 1), max_size=2).map(tuple)

    @st.composite
    def node(draw: st.DrawFn) -> Node:
        kids = draw(children)
        choices = ["work", *(str(i) for i in range(len(kids)))]
        steps = draw(
            st.lists(
                st.lists(st.sampled_from(choices), min_size=1, max_size=2).map(tuple), max_size=4
            ).map(tuple)
        )
        tokens = draw(st.sampled_from([1_000, 5_000, 20_000]))
        return Node(steps, tokens, draw(st.sampled_from([0.0, 0.5, 2.0])), kids)

    return node()


def build(node: Node, counter: list[str]) -> Harness:
    steps = [
        [
            ToolCallRequest("work" if name == "work" else f"child_{name}", {"task": "t"})
            for name in step
        ]
        for step in node.steps
    ]
    harness = Harness(
        Plan(steps, usage=Usage(0, node.tokens), think_s=node.think_s), max_parallel_tool_calls=2
    )

    async def work(task: str) -> str:
        counter.append("work")
        return "worked"

    harness.tools.register(tool(work))
    for index, kid in enumerate(node.children):
        harness.tools.register(
            AgentTool(f"child_{index}", functools.partial(build, kid, counter), description="C.")
        )
    return harness


def every_session(session: Session) -> list[Session]:
    return [session, *(s for child in session.children.values() for s in every_session(child))]


def largest_call(node: Node) -> int:
    return max([node.tokens, *(largest_call(kid) for kid in node.children)])


@settings(max_examples=60)
@given(
    tree=trees(),
    tool_calls=st.integers(1, 8),
    tokens=st.integers(1_000, 60_000),
    deadline_ms=st.sampled_from([None, 1_000, 5_000]),
)
async def test_a_tree_never_exceeds_the_roots_caps_and_its_logs_stay_whole(
    tree: Node, tool_calls: int, tokens: int, deadline_ms: int | None
) -> None:
    counter: list[str] = []
    root = build(tree, counter)
    root.plugin(ToolCallLimit(per_turn=tool_calls))
    root.plugin(UsageLimit(tokens_per_turn=tokens))
    if deadline_ms is not None:
        root.plugin(TurnDeadline(ms=deadline_ms))
    agent = root.loop.create("root")
    started = anyio.current_time()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = await agent.prompt("go")
    took = anyio.current_time() - started
    sessions = every_session(agent.session)
    # tool calls across the whole tree (work and delegations) within the root's cap
    assert len(counter) + len(sessions) - 1 <= tool_calls
    # tokens: checked before each call, so at most what parallel calls had in flight
    spent = agent.session.usage().output_tokens  # the children's included
    assert spent == result.usage.output_tokens
    # each agent has at most one call in flight when a sibling's reply passes the cap
    assert spent < tokens + len(sessions) * largest_call(tree)
    replies = [e for s in sessions for e in s.events if isinstance(e, AssistantMessage)]
    assert result.usage == sum((e.usage for e in replies if e.usage is not None), Usage())
    if deadline_ms is not None:
        assert took <= deadline_ms / 1000
        if result.reason == "deadline":
            assert took == deadline_ms / 1000
    for session in sessions:
        called = [e.call_id for e in session.events if isinstance(e, ToolCallEvent)]
        answered = [e.call_id for e in session.events if isinstance(e, ToolResultEvent)]
        assert sorted(called) == sorted(answered)
        assert len(set(called)) == len(called)
        assert isinstance(session.events[-1], TurnEnd)
        linked = {e.child_session for e in session.events if isinstance(e, ToolResultEvent)}
        assert set(session.children) <= linked
