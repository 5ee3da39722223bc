"""An agent's place: its parent and depth in a tree, and its turn's deadline, changed only
through ``join_tree`` and ``limit_turn`` — virtual time, both backends."""

from __future__ import annotations

import anyio
import pytest

from guardstack.pipeline import Harness, ScriptedModel


async def test_limit_turn_keeps_the_sooner_deadline_and_gives_back_the_one_before() -> None:
    agent = Harness(ScriptedModel([])).loop.create("a")
    assert (agent.turn_deadline, agent.turn_deadline_ms) == (None, None)
    start = anyio.current_time()
    outer = agent.limit_turn(1_000)
    assert agent.turn_deadline == pytest.approx(start + 1.0)
    assert agent.turn_deadline_ms == 1_000
    later = agent.limit_turn(5_000)  # later than the bound that holds: that one stays
    assert agent.turn_deadline_ms == 1_000
    sooner = agent.limit_turn(200)  # sooner: it holds now
    assert agent.turn_deadline == pytest.approx(start + 0.2)
    assert agent.turn_deadline_ms == 200
    sooner()
    later()
    assert agent.turn_deadline_ms == 1_000
    await anyio.sleep(0.5)
    agent.limit_turn(400)
    assert agent.turn_deadline == pytest.approx(start + 0.9)  # 400 ms from now is sooner
    agent.limit_turn(None)
    assert agent.turn_deadline is None
    outer()
    assert agent.turn_deadline is None  # the restore of the first bound: none before it


async def test_join_tree_places_a_child_below_its_parent_inside_its_deadline() -> None:
    harness = Harness(ScriptedModel([]))
    root, child, grandchild = (harness.loop.create(name) for name in ("r", "c", "g"))
    assert (root.parent, root.depth, root.ancestors) == (None, 1, [])
    root.limit_turn(2_000)
    child.join_tree(root)
    grandchild.join_tree(child)
    assert (child.parent, child.depth) == (root, 2)
    assert (grandchild.parent, grandchild.depth, grandchild.ancestors) == (child, 3, [child, root])
    assert grandchild.turn_deadline == root.turn_deadline
    assert grandchild.turn_deadline_ms == 2_000
