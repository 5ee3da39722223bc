"""Everything a plugin author needs, in one small module (as starlette's ``types``).

A *plugin* is any object with ``apply(scope)``; it registers its layers through the
``Scope`` it is given, and everything it registered goes when its handle is
disposed. A *layer* is ``async (*args, call_next) -> result`` on one stage:

=================  ==========================================================  ===========
stage              layer                                                       returns
=================  ==========================================================  ===========
``pre_execute``    ``(call, call_next: PreNext)``                              ``Allow | Deny``
``dispatch``       ``(call, call_next: DispatchNext)``                         ``ToolResult``
``post_execute``   ``(call, result, call_next: PostNext)``                     ``Accept | Block``
``prompt_submit``  ``(agent, text, call_next: PromptNext)``                    ``str``
``model_call``     ``(request, call_next: ModelNext)``                         ``ModelReply``
=================  ==========================================================  ===========

A ``model_call`` layer that fails raises (a ``ModelError`` with a ``MODEL_*`` code);
one that must end the turn as ``blocked`` raises ``TurnBlocked`` naming the limit.

Guards and wrappers import only this module, ``values`` and ``errors`` from the
core (checked by the import contract in ``pyproject.toml``). The shared timeout
mechanism, ``timed_dispatch`` / ``within_budget``, is here too: ``wrappers.Timeout`` and
``guards.ToolCallTimeoutPolicy`` are two configurations of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, runtime_checkable

from guardstack.pipeline.approval import (
    Approve,
    Decision,
    Edit,
    Pending,
    PendingApproval,
    Reject,
    as_pre_decision,
    call_digest,
    decision_kind,
    outside_call_order,
)
from guardstack.pipeline.call_context import CallContext
from guardstack.pipeline.control import Control, ControlStore, Override
from guardstack.pipeline.deadline import (
    model_within_budget,
    timed,
    timed_dispatch,
    watched,
    within,
    within_budget,
)
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.keys import key_parts, new_token, store_key
from guardstack.pipeline.ledger import Ledger, Reservation, Settlement, Window, calendar_periods
from guardstack.pipeline.model import (
    MODEL_FAILED,
    MODEL_OVERLOADED,
    MODEL_RATE_LIMITED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    Model,
    ModelError,
    ModelReply,
    ModelRequest,
    Usage,
    answering_model,
    input_estimate,
    model_error_code,
    stated_output_limit,
)
from guardstack.pipeline.onion import (
    Instrumentation,
    Layer,
    LayerInfo,
    LayerT,
    Pipeline,
    Registration,
)
from guardstack.pipeline.outcome import (
    DISPATCH,
    MODEL,
    UNKNOWN_KEY,
    FailureKind,
    ItemT,
    Lost,
    ModelStage,
    Next,
    Outcome,
    OutcomeT,
    Refusal,
    StageAdapter,
    StageAnswerT,
    StageCallT,
    StageLike,
    ToolStage,
    ValueT,
    adapter_for,
    never_reached,
    stage_of,
)
from guardstack.pipeline.signals import Signals
from guardstack.pipeline.store import Admission, BreakerState, MemoryStore, StateStore, StoreError
from guardstack.pipeline.values import ToolCall, ToolResult
from guardstack.pipeline.verdicts import PostDecision, PreDecision, ToolOutcome

if TYPE_CHECKING:
    from guardstack.pipeline.loop import Agent as Agent
    from guardstack.pipeline.loop import AgentLoop
    from guardstack.pipeline.loop import TurnResult as TurnResult
    from guardstack.pipeline.registry import ToolRegistry

__all__ = [
    "DISPATCH",
    "MODEL",
    "MODEL_FAILED",
    "MODEL_OVERLOADED",
    "MODEL_RATE_LIMITED",
    "MODEL_REJECTED",
    "MODEL_TIMEOUT",
    "MODEL_UNAVAILABLE",
    "UNKNOWN_KEY",
    "Admission",
    "Approve",
    "BreakerState",
    "CallContext",
    "Control",
    "ControlStore",
    "Decision",
    "DispatchLayer",
    "DispatchNext",
    "Edit",
    "Execute",
    "FailureKind",
    "Instrumentation",
    "ItemT",
    "Layer",
    "LayerInfo",
    "Ledger",
    "Lost",
    "MemoryStore",
    "Model",
    "ModelError",
    "ModelLayer",
    "ModelNext",
    "ModelReply",
    "ModelRequest",
    "ModelStage",
    "Next",
    "Outcome",
    "OutcomeT",
    "Override",
    "Pending",
    "PendingApproval",
    "Pipeline",
    "Plugin",
    "PostLayer",
    "PostNext",
    "PreLayer",
    "PreNext",
    "PromptLayer",
    "PromptNext",
    "Refusal",
    "Registration",
    "Reject",
    "Reservation",
    "Scope",
    "Settlement",
    "Signals",
    "StageAdapter",
    "StageAnswerT",
    "StageCallT",
    "StageLike",
    "StateStore",
    "StoreError",
    "StoreLedger",
    "ToolStage",
    "TurnRun",
    "Usage",
    "ValueT",
    "Window",
    "adapter_for",
    "answering_model",
    "as_pre_decision",
    "calendar_periods",
    "call_digest",
    "decision_kind",
    "input_estimate",
    "key_parts",
    "model_error_code",
    "model_within_budget",
    "never_reached",
    "new_token",
    "outside_call_order",
    "stage_of",
    "stated_output_limit",
    "store_key",
    "timed",
    "timed_dispatch",
    "watched",
    "within",
    "within_budget",
]

#: A whole ``registry.execute``: what ``registry.instrument`` hooks wrap.
KeptT = TypeVar("KeptT")

Execute: TypeAlias = Callable[[ToolCall], Awaitable[ToolOutcome]]
PreNext: TypeAlias = Callable[[ToolCall], Awaitable[PreDecision]]
DispatchNext: TypeAlias = Callable[[ToolCall], Awaitable[ToolResult]]
PostNext: TypeAlias = Callable[[ToolCall, ToolResult], Awaitable[PostDecision]]
PromptNext: TypeAlias = Callable[["Agent", str], Awaitable[str]]
ModelNext: TypeAlias = Callable[[ModelRequest], Awaitable[ModelReply]]
#: A layer typed for each stage: what ``use()`` takes there.
PreLayer: TypeAlias = Callable[[ToolCall, PreNext], Awaitable[PreDecision | Pending]]
DispatchLayer: TypeAlias = Callable[[ToolCall, DispatchNext], Awaitable[ToolResult]]
PostLayer: TypeAlias = Callable[[ToolCall, ToolResult, PostNext], Awaitable[PostDecision]]
PromptLayer: TypeAlias = Callable[["Agent", str, PromptNext], Awaitable[str]]
ModelLayer: TypeAlias = Callable[[ModelRequest, ModelNext], Awaitable[ModelReply]]
#: A whole agent turn: what ``loop.instrument_turn`` hooks wrap.
TurnRun: TypeAlias = Callable[["Agent", str], Awaitable["TurnResult"]]


class StoreLedger(StateStore, Ledger, Protocol):
    """A store that is both seams: soft state and the ledger (what caps keep)."""


@runtime_checkable
class Plugin(Protocol):
    """Anything ``harness.plugin`` accepts: it registers what it needs through the scope.

    A plugin's own fields are its frozen configuration; state that changes while it
    works (counts, chains, random generators) is created in ``apply``, so one plugin
    applied to two harnesses keeps two separate states.
    """

    def apply(self, scope: Scope) -> None: ...


class Scope:
    """What a plugin registers through; all of it goes when the plugin's handle is disposed.

    ``store`` is where keyed layers keep soft state and caps their accounts (the
    harness's, unless a layer is given its own: one object is both a ``StateStore`` and
    a ``Ledger``), and ``namespace`` the owner part of this application's keys in it:
    the plugin's id, numbered when one harness applies the same id more than once, so
    the same stack built in two processes names the same state.
    """

    def __init__(
        self,
        tools: ToolRegistry,
        loop: AgentLoop,
        plugin_id: str,
        *,
        store: StateStore | None = None,
        namespace: str | None = None,
        control: Control | None = None,
        version: int = 0,
        kept: dict[str, object] | None = None,
    ) -> None:
        self.tools = tools
        self.loop = loop
        self.plugin_id = plugin_id
        self.store: StateStore = store if store is not None else MemoryStore()
        #: An operator's overrides (``Harness.control``); ``None`` outside a harness.
        self.control = control
        #: The version of the stack this plugin is applied in (``Harness.reload``).
        self.version = version

        self.namespace = namespace or plugin_id
        self._registrations: list[Registration] = []
        self._kept: dict[str, object] = kept if kept is not None else {}

    @property
    def signals(self) -> Signals:
        """Where a layer reports events and resilience metrics (the loop's)."""
        return self.loop.signals

    def store_for(self, store: StateStore | None) -> StateStore:
        """A layer's own ``store=`` if given, else the harness's."""
        return store if store is not None else self.store

    def ledger_for(self, store: StateStore | None) -> StoreLedger:
        """A cap's own ``store=`` if given, else the harness's, as the ``Ledger`` it is."""
        chosen = self.store_for(store)
        if not isinstance(chosen, Ledger):
            raise ConfigError(
                f"{self.plugin_id}: the store {chosen!r} keeps no ledger, and a cap's counts "
                "go through one (MemoryStore and RedisStore are both)",
                plugin=self.plugin_id,
                key="store",
                value=chosen,
            )
        return chosen

    def kept(self, name: str, make: Callable[[], KeptT]) -> KeptT:
        """State this application keeps in memory that a reload of the same plugin id
        must find again (``make()`` the first time): which turn each conversation is in,
        so a cap's per-turn counts — in the store, under that turn's key — go on."""
        found = self._kept.get(name)
        if found is None:
            found = self._kept[name] = make()
        return found  # type: ignore[return-value]

    def use(
        self, stage: Pipeline[Any, LayerT], layer: LayerT, *, name: str | None = None
    ) -> Registration:
        """Add ``layer`` to ``stage`` (e.g. ``scope.tools.dispatch``) for this plugin."""
        return self.adopt(stage.use(layer, name=name))

    def adopt(self, registration: Registration) -> Registration:
        """Dispose ``registration`` with this plugin."""
        self._registrations.append(registration)
        return registration

    def on_dispose(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when this plugin is disposed."""
        self.adopt(Registration(callback))

    def dispose(self) -> None:
        """Undo every registration, newest first."""
        while self._registrations:
            self._registrations.pop().dispose()
