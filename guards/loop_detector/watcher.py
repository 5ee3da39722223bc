"""The layers that watch a conversation's calls and replies and remind, deny or end
the turn when the detector sees a loop."""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Final

import attrs

from guardstack.guards.agent_state import ConversationState
from guardstack.guards.loop_detector.entry import (
    DETECTED_EVENT,
    MAX_CYCLE,
    PLUGIN,
    SOURCE,
    Detection,
    Entry,
    Turn,
    fold,
)
from guardstack.guards.loop_detector.patterns import alike, step_of
from guardstack.pipeline.contract import ModelNext, PostNext, PreNext, PromptNext
from guardstack.pipeline.errors import TurnBlocked
from guardstack.pipeline.signals import LOOP_DETECTIONS, REMINDERS, Shadow, Signals
from guardstack.pipeline.values import TOOL_DENIED, ContextMessage, ToolCall, ToolResult
from guardstack.pipeline.verdicts import Deny, PostDecision, PreDecision

if TYPE_CHECKING:
    from guardstack.guards.loop_detector.detector import LoopDetector
    from guardstack.pipeline.contract import Agent, ModelReply, ModelRequest

logger = logging.getLogger("guardstack")


#: The patterns whose count is of results returned (a denied call returned none).
_OF_RESULTS: Final = frozenset({"no_progress", "repeated_error", "poll", "walking"})


class _Monologue:
    """An agent's text replies across automatic continuations."""

    __slots__ = ("continued", "detections", "pending", "replies")

    def __init__(self) -> None:
        self.replies: list[str] = []
        self.continued = False
        self.detections = 0
        self.pending: Detection | None = None


class Watcher:
    """One application's turns, and the layers that watch and stop loops."""

    __slots__ = ("config", "monologues", "shadow", "signals", "turns")

    def __init__(
        self, config: LoopDetector, turns: ConversationState[Turn], signals: Signals
    ) -> None:
        self.config = config
        self.turns = turns
        self.signals = signals
        self.shadow = Shadow(PLUGIN, signals) if config.shadow else None
        self.monologues: weakref.WeakKeyDictionary[Agent, _Monologue] = weakref.WeakKeyDictionary()

    def _turn(self, call: ToolCall) -> Turn:
        turn = self.turns.get(call)
        if turn is None:
            turn = Turn()
            self.turns.set(call, turn)
        return turn

    def _is_parallel_repeat(self, turn: Turn, entry: Entry) -> bool:
        if not self.config.count_parallel_once:
            return False
        return any(e.step == entry.step and e.key == entry.key for e in turn.entries[-8:])

    async def prompt_submit(self, agent: Agent, text: str, call_next: PromptNext) -> str:
        """A person's prompt starts the ladder afresh; an automatic continuation does not
        (with ``monologue``), and carries the monologue reminder when one is due."""
        config = self.config
        automatic = bool(config.monologue) and fold(text) in {
            fold(prompt) for prompt in config.continue_prompts
        }
        monologue = self.monologues.get(agent)
        if not automatic:
            turn = self.turns.of_agent(agent) if config.across_turns else None
            if turn is not None:  # the ladder starts again; the evidence stays
                turn.detections = 0
                turn.looping.clear()
            else:
                await self.turns.reset_on_prompt(agent, text, _echo)
            self.monologues.pop(agent, None)
            return await call_next(agent, text)
        if monologue is None:
            monologue = self.monologues[agent] = _Monologue()
        monologue.continued = True
        found, monologue.pending = monologue.pending, None
        if found is not None and config.remind is not None and found.number == config.remind:
            if self.shadow is None:
                text = f"{text}\n\n{config.advice(found)}"
            else:
                self.shadow.would("remind", f"agent {agent.session_id}", found.pattern)
        return await call_next(agent, text)

    async def model_call(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        """Watch text replies across automatic continuations (``monologue``); past the
        ``deny`` (or ``end_turn``) detection, a continuation gets no model request."""
        config = self.config
        agent = request.agent
        monologue = self.monologues.get(agent)
        if monologue is not None and monologue.continued and monologue.detections:
            stops = [rung for rung in (config.deny, config.end_turn) if rung is not None]
            if stops and monologue.detections >= min(stops):
                found = Detection("monologue", (), len(monologue.replies), monologue.detections)
                if self.shadow is None:
                    raise TurnBlocked(f"{PLUGIN}: {config.advice(found)} (turn ended)")
                self.shadow.would("end the turn", f"agent {agent.session_id}", found.pattern)
        reply = await call_next(request)
        if reply.tool_calls:
            if monologue is not None:
                monologue.replies.clear()
            return reply
        if monologue is None:
            monologue = self.monologues[agent] = _Monologue()
        if monologue.replies and not alike(monologue.replies[-1], reply.text):
            monologue.replies.clear()
        monologue.replies.append(reply.text)
        repeats = len(monologue.replies)
        if config.monologue and repeats >= config.monologue:
            monologue.detections += 1
            monologue.pending = Detection("monologue", (), repeats, monologue.detections)
            _report(monologue.pending, monologue.detections, self.signals)
        return reply

    async def pre_execute(self, call: ToolCall, call_next: PreNext) -> PreDecision:
        config = self.config
        if (config.deny is None and config.end_turn is None) or not config.tracks(call.name):
            return await call_next(call)
        turn = self._turn(call)
        if not turn.looping or turn.detections + 1 < min(
            value for value in (config.deny, config.end_turn) if value is not None
        ):
            return await call_next(call)
        # Would this call continue a loop detected on its previous repetition? Assume it
        # answers as the tool's last call did (a call whose last result advanced is
        # never stopped).
        last = next((e for e in reversed(turn.entries) if e.name == call.name), None)
        probe = last.outcome if last is not None and last.outcome is not None else ToolResult("")
        predicted = config.entry(call, probe, step_of(call), turn.entries)
        previous = next((e for e in reversed(turn.entries) if e.key == predicted.key), None)
        if previous is None or previous.key not in turn.looping or previous.fresh:
            return await call_next(call)
        predicted = attrs.evolve(previous, step=predicted.step, fresh=False)
        if self._is_parallel_repeat(turn, predicted):
            return await call_next(call)
        found = config.detect([*turn.entries[-(MAX_CYCLE * 16) :], predicted])
        if found is None:
            return await call_next(call)
        come = found.repeats + turn.denied  # this call, and those denied since one ran
        if found.pattern in _OF_RESULTS:
            # the count is of results, and this call has returned none: what ran
            found = attrs.evolve(found, repeats=max(1, found.repeats - 1))
        else:
            found = attrs.evolve(found, repeats=come)
        number = turn.detections + 1
        ends = config.end_turn is not None and number >= config.end_turn
        if ends or (config.deny is not None and number >= config.deny):
            what = "turn ended" if ends else "call denied"
            reason = (
                f"{config.name}: {config.advice(found)} ({what}: call {come} of this loop, "
                "which was not broken)"
            )
            if self.shadow is None:
                return Deny(reason, end_turn=ends)
            decision = "end the turn" if ends else "deny"
            self.shadow.would(decision, f'tool "{call.name}"', f"{found.pattern} loop")
        return await call_next(call)

    async def post_execute(
        self, call: ToolCall, result: ToolResult, call_next: PostNext
    ) -> PostDecision:
        config = self.config
        if not config.tracks(call.name):
            return await call_next(call, result)
        turn = self._turn(call)
        decision = await call_next(call, result)
        denial = result.error.message if result.error is not None else ""
        if result.code == TOOL_DENIED and denial.startswith(f"{PLUGIN}:"):
            turn.detections += 1  # our own denial: the loop went on, and nothing ran
            turn.denied += 1
            return decision
        entry = config.entry(call, result, step_of(call), turn.entries)
        if self._is_parallel_repeat(turn, entry):
            return decision
        turn.entries.append(entry)
        turn.denied = 0
        if len(turn.entries) > MAX_CYCLE * 32:
            del turn.entries[: MAX_CYCLE * 16]
        found = config.detect(turn.entries)
        if found is None:
            turn.looping.discard(entry.key)
            return decision
        turn.looping.add(entry.key)
        turn.detections += 1
        _report(found, turn.detections, self.signals)
        if config.remind is None or turn.detections != config.remind:
            return decision
        if self.shadow is not None:
            self.shadow.would("remind", f'tool "{call.name}"', f"{found.pattern} loop")
            return decision
        reminder = ContextMessage(config.advice(found), SOURCE)
        self.signals.add(REMINDERS, 1, {"pattern": found.pattern})
        return attrs.evolve(decision, additional_contexts=(reminder, *decision.additional_contexts))


async def _echo(agent: Agent, text: str) -> str:
    return text


def _report(found: Detection, number: int, signals: Signals) -> None:
    signals.add(LOOP_DETECTIONS, 1, {"pattern": found.pattern})
    if signals.listened:
        signals.event(
            DETECTED_EVENT,
            {
                "guardstack.loop.pattern": found.pattern,
                "guardstack.loop.tools": list(found.tools),
                "guardstack.loop.repeats": found.repeats,
                "guardstack.loop.detection": number,
                "guardstack.loop.volatile": list(found.volatile),
            },
            "WARN",
        )
    logger.info(
        "loop-detector: %s loop (%s, %d times), detection %d%s",
        found.pattern,
        " -> ".join(found.tools) or "text replies",
        found.repeats,
        number,
        f", volatile: {', '.join(found.volatile)}" if found.volatile else "",
    )
