"""Durable agents on Temporal: each turn a workflow, each model call and tool attempt an activity.

::

    agent = TemporalAgent("researcher", tools=[search, fetch], model=model,
                          plugins=lambda: [Retry(attempts=3), ToolCallTimeoutPolicy(),
                                           RepeatToolReminder(), ToolCallLimit(per_turn=40)])
    async with worker(client, "agents", [agent]):                 # on every worker host
        conversation = Conversation(client, "researcher", "thread-1", "agents")
        result = await conversation.prompt("Find the TODOs")       # from any process

**What runs where.** The turn — the agent loop, the session log, caps, the
reminder, ``Retry`` and its backoff, every timeout — runs in the workflow, so it
is durable: a backoff or a per-attempt deadline is a Temporal timer, and a worker
that dies mid-turn costs nothing but the call in flight. Each model call and each
tool attempt is an activity, run by whichever worker picks it up.

**How order maps to Temporal's timeouts.** guardstack's layers keep their
meaning: a per-attempt timeout (inside a ``Retry``) is a workflow timer around one
activity, which it cancels when it fires; a whole-operation timeout (outside) is a
timer around all of them, backoff included. The activity's own options are derived
so that Temporal never decides in guardstack's place: start-to-close is the tool's
declared budget plus ``grace_ms`` (guardstack's timer always fires first, so the
model reads the seed's ``TOOL_TIMEOUT``, not an activity failure), a heartbeat
timeout of ``heartbeat_ms`` notices a lost worker, and the retry policy is one
attempt — guardstack alone retries, so every attempt is its own activity in the
history. A worker lost mid-call answers the call ``ABORTED`` (a ``Retry`` may run it
again elsewhere, never a tool declared ``idempotent=False``).

Refused at start-up (``ConfigError``): an engine limit (``start_to_close_cap_ms``)
shorter than a tool's budget plus grace, which would cut the budget so the model
never learns it timed out; and activity retries (``activity_attempts`` > 1) in a
stack with a ``Retry``, which would retry in two places.

Determinism: the guard stack is built inside the workflow by ``plugins()``; a
``Retry`` with jitter and no seed gets one from the workflow's random source, and
all time is the workflow's clock.

The package by job: ``agent`` (``TemporalAgent`` and the names), ``activities``,
``turn_workflow`` (``TurnWorkflow``) and ``client`` (``worker``, ``Conversation``,
``serve``).
"""

from guardstack.integrations.temporal.activities import model_call, store_operation, tool_attempt
from guardstack.integrations.temporal.agent import TemporalAgent
from guardstack.integrations.temporal.client import Conversation, TurnOutcome, serve, worker
from guardstack.integrations.temporal.turn_workflow import TurnWorkflow

__all__ = [
    "Conversation",
    "TemporalAgent",
    "TurnOutcome",
    "TurnWorkflow",
    "model_call",
    "serve",
    "store_operation",
    "tool_attempt",
    "worker",
]
