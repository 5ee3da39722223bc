"""``LoopDetector(text=True)``: the model-stage layer that watches an answer's text as it
streams, cuts it where a block starts repeating, and climbs its own ladder.

The first looping answer of a conversation is cut where the repetition began — the
text up to the end of the block's first copy is kept, as the answer — and the agent's
next request carries a note saying so (logged like a reminder). The next looping answer
ends the turn (``blocked``), its text kept up to the same place. An answer that streams
(a model that ``reports_chunks``) is cut as it loops, so the rest of its output limit
is never spent; one that does not is looked at whole, its reasoning too. An answer that
does not loop starts the ladder again.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Final

import anyio
import attrs

from guardstack.guards.loop_detector.entry import PLUGIN, Detection
from guardstack.guards.loop_detector.text import Repeat, TextRepeats, find_repeat
from guardstack.pipeline.contract import ModelNext, ModelReply, ModelRequest
from guardstack.pipeline.errors import TurnBlocked
from guardstack.pipeline.model_members import model_name_of
from guardstack.pipeline.signals import Shadow, Signals

if TYPE_CHECKING:
    from guardstack.guards.loop_detector.detector import LoopDetector
    from guardstack.pipeline.contract import Agent

__all__ = ["LOOP_CUT", "TextWatch"]

#: The ``finish_reason`` of an answer cut where it started repeating (a host that
#: relays the stream itself — the model proxy — ends the client's stream cleanly on it).
LOOP_CUT: Final = "loop"


class _Conversation:
    __slots__ = ("loops", "note")

    def __init__(self) -> None:
        self.loops = 0
        self.note: str | None = None


class TextWatch:
    """One application's watch over the text of its agents' answers."""

    def __init__(self, config: LoopDetector, signals: Signals, shadow: Shadow | None) -> None:
        self.config = config
        self.signals = signals
        self.shadow = shadow
        self.conversations: weakref.WeakKeyDictionary[Agent, _Conversation] = (
            weakref.WeakKeyDictionary()
        )

    def _repeats(self) -> TextRepeats:
        config = self.config
        return TextRepeats(
            min_block=config.text_min_block,
            repeats=config.text_repeats,
            min_chars=config.text_min_chars,
        )

    def _found(self, text: str | None) -> Repeat | None:
        if not text:
            return None
        config = self.config
        return find_repeat(
            text,
            min_block=config.text_min_block,
            repeats=config.text_repeats,
            min_chars=config.text_min_chars,
        )

    async def model_call(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        agent = request.agent
        state = self.conversations.get(agent)
        if state is None:
            state = self.conversations[agent] = _Conversation()
        if state.note is not None and self.shadow is None:
            note, state.note = state.note, None
            agent.note(note, PLUGIN)  # the request rebuilt from the log carries it
            request = attrs.evolve(
                request, messages=[*request.messages, {"role": "user", "content": note}]
            )
        watch = self._repeats()
        pieces: list[str] = []
        found: list[Repeat] = []
        outer = request.on_chunk

        with anyio.CancelScope() as cut:

            def on_chunk(piece: str) -> None:
                if outer is not None:
                    outer(piece)
                if found or not piece:
                    return
                pieces.append(piece)
                hit = watch.feed(piece)
                if hit is not None:
                    found.append(hit)
                    if self.shadow is None:
                        cut.cancel()  # the rest of the answer would only repeat

            reply = await call_next(attrs.evolve(request, on_chunk=on_chunk))
        if cut.cancelled_caught and found:  # cut as it looped: what it said once is kept
            text = "".join(pieces)
            model = model_name_of(agent.model)
            answer = ModelReply(text[: found[0].kept], model=model, finish_reason=LOOP_CUT)
            return self._looped(state, found[0], text, answer)
        hit = found[0] if found else self._found(reply.text)
        looped_in = reply.text
        if hit is None and reply.reasoning:
            hit, looped_in = self._found(reply.reasoning), reply.reasoning
        if hit is None:
            state.loops = 0
            return reply
        if looped_in is reply.text:
            answer = attrs.evolve(reply, text=reply.text[: hit.kept], tool_calls=())
        else:
            reasoning = (reply.reasoning or "")[: hit.kept]
            answer = attrs.evolve(reply, reasoning=reasoning, tool_calls=())
        if self.shadow is not None:
            answer = reply
        return self._looped(state, hit, looped_in or "", answer)

    def _looped(
        self, state: _Conversation, hit: Repeat, text: str, answer: ModelReply
    ) -> ModelReply:
        """A looping answer: counted, said, and the ladder's next rung."""
        from guardstack.guards.loop_detector.watcher import _report

        state.loops += 1
        found = Detection("text", (), hit.repeats, state.loops)
        _report(found, state.loops, self.signals)
        block = " ".join(text[hit.kept - hit.block : hit.kept].split())
        shown = block if len(block) <= 80 else block[:77] + "…"
        ends = state.loops >= 2
        if self.shadow is not None:
            self.shadow.would("end the turn" if ends else "cut the answer", "the answer", shown)
            return answer
        if ends:
            raise TurnBlocked(
                f"{PLUGIN}: the answer repeated the same passage {hit.repeats} times again "
                f'("{shown}"); it was cut there and the turn ended',
                answer=answer,
            )
        state.note = (
            f"Your last answer started repeating the same passage ({hit.repeats} times: "
            f'"{shown}") and was cut there. Do not repeat it: go on from where it was cut, '
            "or say plainly what is blocking you."
        )
        return answer
