"""What a plugin author needs, in one small module (at most 20 names).

A plugin is any object with ``apply(scope)``. There it registers a layer on each stage
it guards — a plain async function typed for that stage, which calls ``call_next`` to
go on, or answers itself — and keeps any state it needs in ``apply``, so one plugin
applied to two harnesses keeps two states::

    from guardstack.pipeline.plugin import DispatchNext, Scope, ToolCall, ToolResult

    class Audit:
        def apply(self, scope: Scope) -> None:
            async def audit(call: ToolCall, call_next: DispatchNext) -> ToolResult:
                result = await call_next(call)
                print(call.name, "->", result.code or "ok")
                return result

            scope.use(scope.tools.dispatch, audit, name="audit")

The stages (``scope.tools`` and ``scope.loop``), and what a layer there takes and
answers:

================================  ====================  ===================================
stage                             ``call_next``         a layer answers
================================  ====================  ===================================
``tools.pre_execute``             ``PreNext``           ``Allow``, ``Deny`` or ``Ask``
``tools.dispatch``                ``DispatchNext``      a ``ToolResult``
``tools.post_execute``            ``PostNext``          ``Accept`` or ``Block``
``loop.model_call``               ``ModelNext``         a ``ModelReply`` (or raises
                                                        ``ModelError``)
``loop.prompt_submit``            ``PromptNext``        the user's text, changed or not
================================  ====================  ===================================

``scope.use`` refuses, by type and at run time, a layer built for another stage. A bad
setting raises ``ConfigError`` naming the plugin, the key and the value. Layers that
serve both stages with one body, the ledger and the outcome core are in
``guardstack.pipeline.contract``.
"""

from __future__ import annotations

from guardstack.pipeline.contract import (
    DispatchNext,
    ModelNext,
    Plugin,
    PostNext,
    PreNext,
    PromptNext,
    Scope,
    StateStore,
)
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.loop import Agent
from guardstack.pipeline.model import ModelError, ModelReply, ModelRequest
from guardstack.pipeline.values import ToolCall, ToolResult
from guardstack.pipeline.verdicts import Accept, Allow, Ask, Block, Deny

__all__ = [
    "Accept",
    "Agent",
    "Allow",
    "Ask",
    "Block",
    "ConfigError",
    "Deny",
    "DispatchNext",
    "ModelError",
    "ModelNext",
    "ModelReply",
    "ModelRequest",
    "Plugin",
    "PostNext",
    "PreNext",
    "PromptNext",
    "Scope",
    "StateStore",
    "ToolCall",
    "ToolResult",
]
