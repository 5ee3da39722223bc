"""LoopDetector: loops the original reminder cannot see, and an escalation ladder to stop them.

Where it belongs: a post-execute layer that watches each call and its result, a
pre-execute layer that denies (or ends the turn at) a call that would continue a
detected loop once the ladder says so, and a prompt-submit layer: each new
person's prompt starts the ladder afresh (with ``monologue``, also a model-call
layer that watches text replies). It composes with ``RepeatToolReminder``: use one
or the other, or both with distinct thresholds.

**Comparing calls.** Calls are compared by tool name and canonical arguments (key
order never matters), results by content — both after normalising what is
volatile (``volatile=True``, the default; see ``guardstack.guards.volatile``), found
by how values look and behave, never by key names alone: date-times, epoch
timestamps, UUIDs and long hex ids wherever they are; a field that changes on every
repeat while the result stays the same (key names such as ``nonce`` or
``request_id`` are hints there, never the rule); counters that step by one from the
previous call of the same tool, and in the result of the same call made again;
case and whitespace in free text; times, ids and durations in results. Your own
patterns (``volatile=["nonce"]``) are masked outright. Nothing else is ever merged:
two calls that differ in a path, a plain date, a page that returned results or a
refined query stay two calls.

**Patterns** (each an int threshold, or ``None`` for off), over the calls of one
conversation's turn:

* ``identical=N`` — the N-th identical call in a row whose result did not advance
  (a result it had not returned before in the run is progress, never a loop);
* ``cycle=N`` — a sequence of k calls and their results (2 ≤ k ≤ 5, not itself one
  call repeated) repeated N times back to back, at call k·N;
* ``no_progress=N`` — the same call returning the same result N times in a row;
* ``repeated_error=N`` — the same call failing the same way N times, other calls
  between them allowed (counted back to the same call, or the same tool, answered
  otherwise);
* ``poll=N`` — the same call answered the same *pending* status ("running",
  "queued", "in progress"…) N times in a row: a poll is given longer than
  ``no_progress``, whatever the tool is called;
* ``walking=N`` — one numeric argument keeps moving (a page, an offset) while the
  tool's result stays empty or the same, N times in a row: paging past the end;
* ``monologue=N`` (opt-in) — N near-identical text replies in a row across turns
  whose prompt is one of ``continue_prompts`` (an autonomous runner's "Continue."):
  such prompts do not reset the ladder. Replies that share a long template and
  differ after it are not near-identical.

**Bookkeeping** is recognised without naming it: a call of another tool whose result
is empty (a ``think`` that returns nothing, a search that found nothing), constant
(what that tool answered last time to other arguments) or an acknowledgement
("ok", "noted", "plan updated"…) gives the next calls nothing to depend on, so the
patterns look through it (an ``update_plan`` between the rounds of a cycle does not
hide the cycle). ``exclude`` (and ``include``) stay for tools
you want ignored outright. With ``count_parallel_once`` (the default), identical
calls made in the same parallel step count once.

**Across turns** (``across_turns=True``, the default) a person's prompt starts the
ladder again but keeps the evidence: the same call answered the same way once a turn
for three turns is a loop. ``across_turns=False`` starts each turn from nothing.

**The ladder** counts detections per conversation within a turn: at detection
``remind`` the model gets an advisory message naming the loop and the fields
treated as volatile (source ``loop-detector``); from detection ``deny`` on, a call
that would continue a loop detected on its previous call gets ``TOOL_DENIED`` — a
call whose last result advanced never does; at detection ``end_turn`` the turn ends
``blocked``. ``None`` switches a rung off.

Each detection is logged on the ``guardstack`` logger (INFO) and is a span event
naming the pattern and the volatile fields. It never raises on any arguments or
results.

Defaults were chosen on the tuning halves of the generated corpus and of real
conversations (tau-bench's published airline runs; ``python -m benchmarks.loops
--tune``) and are reported on the validation halves, which the tuning never saw,
and on the shipped corpus; the README gives the tables. Three identical calls with
identical results are a loop at the defaults (``no_progress=3``).

The package by job: ``detector`` (``LoopDetector``, its settings and its decision),
``patterns`` (the shapes a loop takes), ``entry`` (what is kept of a call and a
turn) and ``watcher`` (the layers that remind, deny and end the turn).
"""

from guardstack.guards.loop_detector.detector import LoopDetector
from guardstack.guards.loop_detector.entry import DETECTED_EVENT, SOURCE, Detection

__all__ = ["DETECTED_EVENT", "SOURCE", "Detection", "LoopDetector"]
