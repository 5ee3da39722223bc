"""What the resilience layers share: state per tool (or model), bounded; stage plumbing.

A breaker's window, a limiter's queue and a bucket's tokens are kept per key: the
tool's name on the dispatch stage, the model's name on the model stage, or one
shared state when the layer is given ``key=``. The map is bounded: beyond
``MAX_KEYS`` the least recently used *idle* states are forgotten (a state with
calls in flight or waiting is never dropped, so no limit is ever lost), and a
forgotten key starts afresh.

State lives in one process, created when the layer is applied, as in Polly and
resilience4j: one application is shared by every agent of that harness.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Final, Generic, Protocol, TypeVar

from guardstack.pipeline.contract import ModelNext, ModelRequest, Scope
from guardstack.pipeline.validate import invalid, non_empty_text
from guardstack.pipeline.values import ToolCall

__all__ = [
    "MAX_KEYS",
    "Keyed",
    "PerKey",
    "StageLayers",
    "Validator",
    "check_key",
    "model_key",
    "positive",
    "ratio",
    "tool_key",
    "use_on_stage",
]

#: An attrs validator.
Validator = Callable[[Any, Any, Any], None]

#: How many keys a layer keeps state for before forgetting idle ones.
MAX_KEYS: Final = 10_000


class _Idle(Protocol):
    def idle(self) -> bool: ...


S = TypeVar("S", bound=_Idle)


class Keyed(Generic[S]):
    """One state per key, made on first use, least recently used idle ones forgotten."""

    def __init__(self, factory: Callable[[], S], max_keys: int = MAX_KEYS) -> None:
        self._factory = factory
        self._max_keys = max_keys
        self._states: OrderedDict[Hashable, S] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def get(self, key: Hashable) -> S:
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            return state
        state = self._states[key] = self._factory()
        if len(self._states) > self._max_keys:
            self._forget_idle()
        return state

    def _forget_idle(self) -> None:
        for key in [key for key, state in self._states.items() if state.idle()]:
            if len(self._states) <= self._max_keys:
                return
            del self._states[key]


class _Keyed(Protocol):
    @property
    def key(self) -> str | None: ...


C = TypeVar("C", bound=_Keyed)


class PerKey(Generic[C, S]):
    """One application of a keyed layer: its configuration and a state per key.

    ``state(key)`` is the state of a tool (or model), or the one shared state when
    the layer was given ``key=``.
    """

    __slots__ = ("config", "states")

    def __init__(self, config: C, factory: Callable[[], S]) -> None:
        self.config = config
        self.states: Keyed[S] = Keyed(factory)

    def state(self, key: Hashable) -> S:
        shared = self.config.key
        return self.states.get(shared if shared is not None else key)

    def __repr__(self) -> str:
        return repr(self.config)


class StageLayers(Protocol):
    """A layer object for both stages: called on tool calls, ``model_layer`` on model calls."""

    def __call__(self, call: ToolCall, call_next: Any) -> Any: ...

    def model_layer(self, request: ModelRequest, call_next: ModelNext) -> Any: ...


def use_on_stage(scope: Scope, stage: str, layers: StageLayers, name: str) -> None:
    """Register ``layers`` on the stage a plugin names: ``dispatch`` or ``model``."""
    if stage == "model":
        scope.use(scope.loop.model_call, layers.model_layer, name=name)
    else:
        scope.use(scope.tools.dispatch, layers, name=name)


def tool_key(call: ToolCall) -> str:
    return call.name


def model_key(request: ModelRequest) -> str:
    name = getattr(request.agent.model, "model", None)
    return name if isinstance(name, str) and name else "model"


def check_key(plugin: str, value: object) -> str | None:
    """``key=``: ``None`` (per tool or model) or the name of one shared state."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(plugin, "key", value, "a name shared by every call, or None (per tool)")
    return non_empty_text(plugin, "key", value)


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def positive(plugin: str, key: str) -> Validator:
    """A number > 0."""

    def check(_: Any, __: Any, value: Any) -> None:
        if not _finite(value) or value <= 0:
            raise invalid(plugin, key, value, "a number > 0")

    return check


def ratio(plugin: str, key: str, *, zero: bool = False) -> Validator:
    """A number in (0, 1], or [0, 1] with ``zero``."""
    lowest = "[0" if zero else "(0"

    def check(_: Any, __: Any, value: Any) -> None:
        if not _finite(value) or value > 1 or value < 0 or (value == 0 and not zero):
            raise invalid(plugin, key, value, f"a number in {lowest}, 1]")

    return check
