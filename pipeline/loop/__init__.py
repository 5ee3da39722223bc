"""The agent loop: prompt, model, tool calls, results, contexts, repeat.

One turn of ``agent.prompt(text)``:

1. the ``prompt_submit`` stage sees the person's text (guards reset per-turn state
   here), then ``turn/start`` and the person's ``user/message`` are logged;
2. each step logs ``step/start``, asks the model through the ``model_call`` stage
   (a ``ModelRequest`` holding ``session.messages()``), logs the
   ``assistant/message`` with the reply's usage and reasoning, runs every tool
   call through ``tools.execute`` with ``call.agent`` set, logs ``tool/call`` /
   ``tool/result`` in the model's order, then the step's additional contexts as
   plugin-sourced ``user/message`` events — after all of the step's results, never
   between two — and ``step/end``;
3. the turn ends when the model answers without tool calls (``completed``), at
   ``max_steps`` (``max-steps``), when a cap says so (``blocked``: a tool-stage cap
   through ``Deny(end_turn=True)``, a model-stage one by raising ``TurnBlocked``),
   when the model call fails (``error``) or when it is cancelled (``aborted``).

The ``model_call`` stage is an onion like the tool stages: a layer is
``async (request, call_next) -> ModelReply`` and the innermost calls
``agent.model.complete(request.messages, request.tools)``; model-stage ``Timeout``,
``Retry`` and ``Metrics`` sit there, in the order registered. A system prompt is
logged once, as the session's first event, so the log still rebuilds every
request. ``TurnResult.usage`` is the turn's tokens, ``agent.usage`` the session's.

With ``max_parallel_tool_calls > 1`` the dispatch of a step's calls overlaps, while
pre-execute, post-execute and the logged results keep the model's order, so guards
see calls in the order the model made them.

Cancellation keeps the log whole: every ``tool/call`` gets exactly one
``tool/result`` (``ABORTED`` for a call that was running, ``ABORTED_BEFORE_DISPATCH``
for one never started), then ``turn/end`` with reason ``aborted``; a cancel from
outside re-raises after that, ``agent.cancel()`` returns the aborted turn.

The package by job: ``agent_loop`` (what the agents share), ``agent`` (a conversation's
turns and steps), ``paused`` (a turn waiting for approval, and its resume),
``step_order`` (a parallel step's order), ``reply`` (the checks on a model's reply),
``turn_result``.
"""

from guardstack.pipeline.contract import TurnRun
from guardstack.pipeline.loop.agent import Agent
from guardstack.pipeline.loop.agent_loop import AgentLoop
from guardstack.pipeline.loop.turn_result import TurnResult

__all__ = ["Agent", "AgentLoop", "TurnResult", "TurnRun"]
