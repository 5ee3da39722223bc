"""A conversation is one agent session (``model_proxy/conversations.py``): the property —
any interleaving of runs of one prompt (one after the other or at once), with cache
markers moved between requests as Claude Code moves them — every run's requests land in
one conversation of their own, never one another's."""

from __future__ import annotations

import copy
from typing import Any

import anyio
from hypothesis import given
from hypothesis import strategies as st

from guardstack.gateway.model_proxy.conversations import (
    Conversations,
    digests,
    family,
    identity,
)
from guardstack.pipeline import Harness, ScriptedModel

HEADER = "x-guardstack-conversation"


def _run_history(run: int, steps: int) -> list[list[Any]]:
    """The histories one run sends: its first prompt, then a tool call and result more
    each step (the call ids are the run's own, as a model's are)."""
    history: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]}
    ]
    sent = [copy.deepcopy(history)]
    for step in range(steps):
        call = f"toolu_{run}_{step}"
        history += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": call, "name": "Bash",
                                               "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call,
                                          "content": "a.py"}]},
        ]  # fmt: skip
        sent.append(copy.deepcopy(history))
    return sent


def _with_marker_moved(history: list[Any], where: int) -> list[Any]:
    """The history with Claude Code's ``cache_control`` marker on one block only."""
    moved = copy.deepcopy(history)
    blocks = [block for message in moved for block in message["content"]]
    for block in blocks:
        block.pop("cache_control", None)
    blocks[where % len(blocks)]["cache_control"] = {"type": "ephemeral"}
    return moved


@given(
    runs=st.integers(2, 4),
    steps=st.integers(1, 5),
    order=st.randoms(use_true_random=False),
    markers=st.lists(st.integers(0, 50), min_size=40, max_size=40),
    session_ids=st.booleans(),
)
def test_runs_of_one_prompt_never_share_a_conversation(
    runs: int, steps: int, order: Any, markers: list[int], session_ids: bool
) -> None:
    harness = Harness(ScriptedModel([]))
    made: list[str] = []

    def make(session: str, tenant: str | None, labels: Any) -> Any:
        made.append(session)
        return harness.loop.create(session)

    conversations = Conversations(make, idle_s=3600, most=1000)
    queues = {run: _run_history(run, steps) for run in range(runs)}
    seen: dict[int, set[int]] = {run: set() for run in range(runs)}
    sessions: dict[int, set[str]] = {run: set() for run in range(runs)}
    turn = 0

    async def drive() -> None:
        nonlocal turn
        while any(queues.values()):
            run = order.choice([r for r, left in queues.items() if left])
            history = _with_marker_moved(queues[run].pop(0), markers[turn % len(markers)])
            turn += 1
            headers = {"x-claude-code-session-id": f"session-{run}"} if session_ids else {}
            first = history[0]["content"][0]["text"]
            name = identity(headers, HEADER, "You are Claude Code.", first, {})
            asked = [
                block["tool_use_id"]
                for message in history
                for block in message["content"]
                if block.get("type") == "tool_result"
            ]
            conversation, _ = conversations.get("tenant", name, digests(history), call_ids=asked)
            # the answer the proxy relays asks for the run's next call: decided then
            conversation.decided.add(f"toolu_{run}_{len(asked)}")
            seen[run].add(id(conversation))
            sessions[run].add(conversation.agent.session_id)

    anyio.run(drive)
    assert all(len(found) == 1 for found in seen.values()), seen  # one conversation a run
    objects = [next(iter(found)) for found in seen.values()]
    assert len(set(objects)) == runs  # ... of its own
    names = [next(iter(found)) for found in sessions.values()]
    assert len(set(names)) == runs  # and its own session id: its own counts in the ledger


def test_the_system_prompt_is_part_of_the_identity_on_every_api() -> None:
    """Reported: on Messages and Responses the system prompt is top-level, so it was
    never part of the digest: two agents with one first message were one conversation."""
    one = identity({}, HEADER, "You review code.", "Start.", {})
    other = identity({}, HEADER, "You write tests.", "Start.", {})
    assert one != other
    assert identity({"session-id": "abc"}, HEADER, "x", "y", {}) == "session:abc"
    assert identity({}, HEADER, "x", "y", {"prompt_cache_key": "k1"}) == "session:k1"
    assert identity({HEADER: "mine", "session-id": "abc"}, HEADER, "x", "y", {}) == "named:mine"


def test_a_history_that_does_not_continue_starts_a_new_conversation() -> None:
    harness = Harness(ScriptedModel([]))
    conversations = Conversations(
        lambda s, t, labels: harness.loop.create(s, tenant=t, labels=labels),
        idle_s=3600,
        most=100,
    )
    long = _run_history(0, 3)[-1]

    async def drive() -> tuple[Any, Any, Any]:
        first, _ = conversations.get(None, "same", digests(long))
        shorter, fresh = conversations.get(None, "same", digests(long[:1]))
        assert fresh
        more = [*long, {"role": "user", "content": "more"}]
        again, _ = conversations.get(None, "same", digests(more))
        return first, shorter, again

    first, shorter, again = anyio.run(drive)
    assert shorter is not first
    assert again is first  # the longest history it continues


def _reordered(history: list[Any], shift: int) -> list[Any]:
    """The history as one real agent sends it: its first prompt kept first, an earlier
    assistant/user pair moved behind the later ones (a different pair each time)."""
    head, pairs = history[:1], [history[i : i + 2] for i in range(1, len(history) - 1, 2)]
    if len(pairs) < 2:
        return copy.deepcopy(history)
    moved = pairs.pop(shift % len(pairs))
    return copy.deepcopy(head + [m for pair in pairs for m in pair] + moved)


@given(
    runs=st.integers(1, 3),
    steps=st.integers(2, 6),
    order=st.randoms(use_true_random=False),
    shifts=st.lists(st.integers(0, 10), min_size=30, max_size=30),
)
def test_a_run_that_reorders_its_history_stays_one_conversation(
    runs: int, steps: int, order: Any, shifts: list[int]
) -> None:
    """Reported (#66): a client that sends no session id and moves an earlier pair
    behind later messages on every request was a new conversation each time — so
    ``per_session`` caps never bound. Any interleaving of such runs: each run one
    conversation, of its own."""
    harness = Harness(ScriptedModel([]))
    conversations = Conversations(
        lambda s, t, labels: harness.loop.create(s, tenant=t), idle_s=3600, most=1000
    )
    queues = {run: _run_history(run, steps) for run in range(runs)}
    seen: dict[int, set[int]] = {run: set() for run in range(runs)}
    turn = 0

    async def drive() -> None:
        nonlocal turn
        while any(queues.values()):
            run = order.choice([r for r, left in queues.items() if left])
            history = _reordered(queues[run].pop(0), shifts[turn % len(shifts)])
            turn += 1
            first = history[0]["content"][0]["text"]
            name = identity({}, HEADER, "You are an agent.", first, {})
            related = family({"authorization": "Bearer k"}, HEADER, "You are an agent.")
            asked = [
                block["tool_use_id"]
                for message in history
                for block in message["content"]
                if block.get("type") == "tool_result"
            ]
            conversation, _ = conversations.get(
                "t", name, digests(history), call_ids=asked, related=related
            )
            # the answer the proxy relays asks for the run's next call: decided then
            conversation.decided.add(f"toolu_{run}_{len(asked)}")
            seen[run].add(id(conversation))

    anyio.run(drive)
    assert all(len(found) == 1 for found in seen.values()), seen
    assert len({next(iter(found)) for found in seen.values()}) == runs


def test_through_the_proxy_a_reordering_client_is_held_to_its_session_cap() -> None:
    """Reported: ``model-call-limit {per_session: 2}`` let 4 calls of one task through a
    client that reorders its history on every request; now the third is the stop."""
    import httpx

    from guardstack.gateway.model_proxy import ModelProxy
    from guardstack.guards import ModelCallLimit
    from tests.integrations.runaway import Runaway

    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {}}}]

    async def drive(upstream: Runaway) -> list[str | None]:
        harness = Harness()
        harness.plugin(ModelCallLimit(per_session=2))
        proxy = ModelProxy(harness, upstream.url)
        transport = httpx.ASGITransport(app=proxy.app)
        history: list[Any] = [{"role": "user", "content": "Fix the build."}]
        stops: list[str | None] = []
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as raw:
            for step in range(4):
                sent = _reordered_chat(history, step)
                answer = await raw.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": sent, "tools": tools},
                    headers={"authorization": "Bearer k"},
                )
                stops.append(answer.headers.get("x-guardstack-stopped"))
                message = answer.json()["choices"][0]["message"]
                calls = message.get("tool_calls") or []
                history.append({"role": "assistant", "content": None, "tool_calls": calls})
                history += [{"role": "tool", "tool_call_id": c["id"], "content": f"out {step}"}
                            for c in calls]  # fmt: skip
        await proxy.aclose()
        return stops

    with Runaway(bound=10) as upstream:
        stops = anyio.run(drive, upstream)
    assert stops[:2] == [None, None]
    assert stops[2] == "model-call-limit"


def _reordered_chat(history: list[Any], step: int) -> list[Any]:
    """Chat messages with the earliest assistant/tool pair moved behind the later ones."""
    head, rest = history[:1], history[1:]
    if step < 2 or len(rest) < 4:
        return copy.deepcopy(history)
    return copy.deepcopy(head + rest[2:] + rest[:2])
