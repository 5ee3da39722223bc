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

from guardstack.gateway.model_proxy.conversations import Conversations, digests, identity
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
