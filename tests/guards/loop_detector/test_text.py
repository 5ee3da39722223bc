"""Loops inside an answer's text (``LoopDetector(text=True)``): a block that keeps
repeating is found as the text streams, the stream cut there with what was said once
kept; a note the first time, the end of the turn the next; healthy text untouched."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.guards import LoopDetector
from guardstack.guards.loop_detector.text import TextRepeats, find_repeat
from guardstack.pipeline import ConfigError, Harness, ModelReply, ScriptedModel
from guardstack.pipeline.testing import Streamed

LOOPING = "I will check the configuration file once more to be certain. "
SAID_ONCE = "Plan: read the config.\n" + LOOPING


def streamed(text: str, size: int = 7) -> Streamed:
    return Streamed([(0.01, text[i : i + size]) for i in range(0, len(text), size)])


def loops(times: int = 40) -> str:
    return "Plan: read the config.\n" + LOOPING * times


def logged(agent: Any) -> list[Any]:
    return list(agent.session.events)


HEALTHY = [
    "| name | value |\n|------|-------|\n" + "".join(f"| key{n} | {n * n} |\n" for n in range(40)),
    "def f(x):\n" + "".join(f"    y{n} = x + {n}\n" for n in range(40)) + "    return y0\n",
    "Steps:\n" + "".join(f"{n}. Open file_{n}.py and fix its imports.\n" for n in range(30)),
    "=" * 400 + "\nA title\n" + "-" * 400,
    "[" + ", ".join(["0"] * 300) + "]",
    "The quick brown fox. " * 2 + "Then it rested, and the story ended there for good.",
]


@pytest.mark.parametrize("text", HEALTHY)
def test_healthy_text_is_not_a_loop(text: str) -> None:
    assert find_repeat(text, min_block=20, repeats=3, min_chars=120) is None


def test_a_loop_is_found_and_what_was_said_once_is_kept() -> None:
    found = find_repeat(loops(6), min_block=20, repeats=3, min_chars=120)
    assert found is not None
    assert (found.block, found.repeats) == (len(LOOPING), 6)
    assert loops(6)[: found.kept] == SAID_ONCE


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.text(alphabet="abcdefgh .,\n", max_size=300),
    block=st.text(alphabet="abcdefghijklmnop .,\n", min_size=20, max_size=200),
    times=st.integers(3, 12),
    piece=st.integers(1, 40),
)
def test_any_block_repeated_enough_is_found_as_it_streams(
    prefix: str, block: str, times: int, piece: int
) -> None:
    """Whatever came before and however the text arrives in pieces: found once the
    copies reach the thresholds, and what is kept holds the block once, whole."""
    text = prefix + block * times
    if len(block) * times < 120 or (block + block).find(block, 1) < len(block):
        return  # too little to count, or the block is itself a repetition of something
    watch = TextRepeats(min_block=20, repeats=3, min_chars=120)
    hit = None
    for start in range(0, len(text), piece):
        hit = watch.feed(text[start : start + piece]) or hit
        if hit is not None:
            break
    else:
        hit = hit or find_repeat(text, min_block=20, repeats=3, min_chars=120)
    assert hit is not None
    assert hit.block % len(block) == 0 or len(block) % hit.block == 0
    kept = text[: hit.kept]
    assert block in kept + block  # the kept text ends inside or after the first copy
    assert kept.count(block) <= 2


async def test_a_streamed_loop_is_cut_noted_then_ends_the_turn() -> None:
    model = ScriptedModel([streamed(loops()), streamed(loops())])
    harness = Harness(model)
    harness.plugin(LoopDetector(text=True))
    agent = harness.loop.create("s")
    first = await agent.prompt("check the config")
    assert first.reason == "completed"
    assert first.text == SAID_ONCE  # cut as it looped; what it said once is kept
    second = await agent.prompt("go on")
    assert second.reason == "blocked"
    assert "repeated the same passage" in str(second.error)
    # the second request carried the note, logged like a reminder
    note = model.requests[1][-1]
    assert note["role"] == "user"
    assert "started repeating the same passage" in note["content"]
    events = logged(agent)
    answers = [e.text for e in events if e.type == "assistant/message"]
    assert answers == [SAID_ONCE, SAID_ONCE]  # the turn that ended keeps its partial too


async def test_the_stream_is_cut_where_it_loops_not_at_its_end() -> None:
    """The rest of the output limit is never read: the model's stream stops early."""
    seen: list[str] = []

    class Counting(Streamed):
        async def play(self, on_chunk: Any) -> ModelReply:
            def counted(piece: str) -> None:
                seen.append(piece)
                if on_chunk is not None:
                    on_chunk(piece)

            return await super().play(counted)

    text = loops(400)  # about 24,000 characters if read to the end
    model = ScriptedModel([Counting([(0.001, text[i : i + 8]) for i in range(0, len(text), 8)])])
    harness = Harness(model)
    harness.plugin(LoopDetector(text=True))
    result = await harness.loop.create("s").prompt("go")
    assert result.text == SAID_ONCE
    assert len("".join(seen)) < 400  # cut after the third copy, not after 24,000 chars


async def test_an_answer_that_does_not_stream_is_looked_at_whole() -> None:
    model = ScriptedModel([ModelReply(loops(10)), ModelReply("A clean answer.")])
    harness = Harness(model)
    harness.plugin(LoopDetector(text=True))
    agent = harness.loop.create("s")
    assert (await agent.prompt("go")).text == SAID_ONCE
    assert (await agent.prompt("again")).text == "A clean answer."  # the ladder starts over


async def test_looping_reasoning_is_cut_too() -> None:
    model = ScriptedModel([ModelReply("Done.", reasoning=loops(8))])
    harness = Harness(model)
    harness.plugin(LoopDetector(text=True))
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert result.text == "Done."
    [answer] = [e for e in logged(agent) if e.type == "assistant/message"]
    assert answer.reasoning == SAID_ONCE


@pytest.mark.parametrize("text", HEALTHY)
async def test_healthy_streamed_answers_pass_untouched(text: str) -> None:
    harness = Harness(ScriptedModel([streamed(text)]))
    harness.plugin(LoopDetector(text=True))
    assert (await harness.loop.create("s").prompt("go")).text == text


async def test_in_shadow_nothing_is_cut() -> None:
    harness = Harness(ScriptedModel([streamed(loops(12))]))
    harness.plugin(LoopDetector(text=True, shadow=True))
    assert (await harness.loop.create("s").prompt("go")).text == loops(12)


def test_the_text_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="text_repeats"):
        Harness().load([{"name": "loop-detector", "config": {"text": True, "text_repeats": 1}}])
    with pytest.raises(ConfigError, match="text"):
        Harness().load([{"name": "loop-detector", "config": {"text": "yes"}}])
    # text alone is a detector
    Harness().load([{"name": "loop-detector", "config": {
        "text": True, "identical": None, "cycle": None, "no_progress": None,
        "repeated_error": None, "walking": None, "poll": None}}])  # fmt: skip


@pytest.mark.parametrize(
    "line",
    ["- [x] passed\n", "| ok | ok |\n", "* done\n", "3. passed\n", "[INFO] tick\n", "> ok\n"],
)
def test_a_checklist_of_one_short_line_repeated_is_not_a_loop(line: str) -> None:
    """Reported: 40 identical ``- [x] passed`` lines were cut after the first (the
    block passed ``text_min_block`` and, seven copies on, ``text_min_chars``)."""
    text = "Results:\n" + line * 40
    found = find_repeat(text, min_block=12, repeats=5, min_chars=80)
    assert found is None


def test_a_repeated_sentence_on_its_own_line_is_still_a_loop() -> None:
    text = "Let me look.\n" + "I will now check the configuration file again.\n" * 10
    found = find_repeat(text, min_block=12, repeats=5, min_chars=80)
    assert found is not None
