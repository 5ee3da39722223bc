"""What the resilience layers share: a stage adapter, a state store, a key per call.

A breaker's window, a limiter's slots and a bucket's tokens are kept per key — the
tool's name on the dispatch stage (one ``<unknown>`` key for every name no tool is
registered under), the model's name on the model stage, or one shared key when the
layer is given ``key=`` — in a ``StateStore``: the harness's (a ``MemoryStore``
unless it was given another), or the layer's own ``store=``. A key is built from
typed parts (``store_key(namespace, kind, name)``), so two breakers in one harness
never share a window and no tool's name can reach another entry's key.

When the store fails (it is down, too slow, or answers garbage), a layer does what
``on_error`` says — the store's, else the layer's default: ``"open"`` lets the call
through (a ``GuardstackWarning`` at most once a minute per layer, a count kept),
``"closed"`` answers the layer's own refusal naming the store.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Collection, Mapping, Sized
from typing import Any, Final, Literal, Protocol, get_args

import anyio
from opentelemetry.util.types import AttributeValue

from guardstack.pipeline.contract import (
    MODEL,
    FailureKind,
    Layer,
    Scope,
    StageAdapter,
    StageLike,
    StateStore,
    adapter_for,
    key_parts,
    store_key,
)
from guardstack.pipeline.errors import GuardstackError, GuardstackWarning
from guardstack.pipeline.signals import LIMITER_WAIT, STORE_ERRORS, Signals
from guardstack.pipeline.validate import codes, invalid, non_empty_text

__all__ = [
    "OnError",
    "StateKeys",
    "StoreFailures",
    "Validator",
    "check_key",
    "check_store",
    "codes_of",
    "positive",
    "ratio",
    "refuse_names_without_names",
    "register",
    "stage_repr",
    "suspends",
]

logger = logging.getLogger("guardstack")

#: An attrs validator.
Validator = Callable[[Any, Any, Any], None]
OnError = Literal["open", "closed"]
#: A store failure warns at most this often per layer application.
_WARN_EVERY_S: Final = 60.0
#: Store keys made from names are cached up to this many names (tools are few; models too).
_MAX_CACHED_KEYS: Final = 10_000


def stage_repr(stage: StageLike) -> str:
    """What a layer's repr adds for its stage: nothing for the default, ``stage='model'``."""
    name = adapter_for(stage).name
    return "" if name == "dispatch" else f", stage={name!r}"


def codes_of(stage: StageLike, kinds: Mapping[str, tuple[FailureKind, ...]]) -> frozenset[str]:
    """A layer's default codes: the kinds it names for the stage, in the stage's own codes."""
    adapter = adapter_for(stage)
    return frozenset(adapter.code_for(kind) for kind in kinds[adapter.name])


def extra_codes(plugin: str, value: object) -> frozenset[str]:
    """A layer's ``extra_on=``: codes added to its ``on`` (``None`` or empty: none)."""
    if value is None or (
        isinstance(value, Collection) and not isinstance(value, str) and not value
    ):
        return frozenset()
    return codes(plugin, "extra_on", value)


def with_extra_codes(layer: Any, plugin: str) -> None:
    """One rule for ``on=`` in every layer: ``on=`` replaces the layer's default codes,
    ``extra_on=`` adds to them (or to the ``on=`` given). Checks both against the
    layer's stage and folds ``extra_on`` into ``on``, so the layer reads one set."""
    check_codes(plugin, "extra_on", layer.stage, layer.extra_on)
    if layer.extra_on:
        object.__setattr__(layer, "on", layer.on | layer.extra_on)
        object.__setattr__(layer, "extra_on", frozenset())
    check_codes(plugin, "on", layer.stage, layer.on)


def check_codes(plugin: str, key: str, stage: StageLike, codes: object) -> None:
    """Codes a layer on ``stage`` can never see are a mistake: a bare kind
    (``RATE_LIMITED``) or another stage's code (``TOOL_TIMEOUT`` on model calls). Raise
    naming the code the stage uses instead. Other codes (a tool's own) are accepted."""
    if callable(codes) or not isinstance(codes, Collection):
        return
    adapter = adapter_for(stage)
    other = adapter_for("dispatch" if adapter.name == "model" else "model")
    kinds: tuple[FailureKind, ...] = get_args(FailureKind)
    for code in sorted(codes):
        meant = next(
            (
                adapter.code_for(kind)
                for kind in kinds
                if code in (kind, other.code_for(kind)) and code != adapter.code_for(kind)
            ),
            None,
        )
        if meant is not None:
            raise invalid(
                plugin,
                key,
                sorted(codes),
                f"codes the {adapter.name} stage gives ({code!r} never happens there; "
                f"did you mean {meant!r}?)",
            )


def refuse_names_without_names(plugin: str, stage: StageLike, **patterns: tuple[str, ...]) -> None:
    """``tools=``/``exclude=`` on a stage whose calls carry no tool name: a mistake."""
    adapter = adapter_for(stage)
    if adapter.calls_tools:
        return
    for key, value in patterns.items():
        if value:
            raise invalid(plugin, key, value, f"empty on the {adapter.name} stage (no tools)")


def register(scope: Scope, stage: StageLike, layer: Layer, name: str) -> None:
    """Register ``layer`` on the stage a plugin names: ``dispatch`` or ``model``."""
    if adapter_for(stage) is MODEL:
        scope.use(scope.loop.model_call, layer, name=name)
    else:
        scope.use(scope.tools.dispatch, layer, name=name)


class _Keyed(Protocol):
    @property
    def key(self) -> str | None: ...


class StoreFailures:
    """One application's answer to a failing store, and its count of failures."""

    __slots__ = ("_warned_at", "count", "layer", "policy", "signals", "store")

    def __init__(
        self, layer: str, store: StateStore, default: OnError, signals: Signals | None = None
    ) -> None:
        self.layer = layer
        self.store = store
        self.policy: OnError = store.on_error or default
        self.count = 0
        self.signals = signals
        self._warned_at = -math.inf

    def fails_open(self, error: BaseException) -> bool:
        """Count a store failure; ``True`` to let the call through, ``False`` to refuse it.
        A mistake (``StoreUnsupported``, any ``GuardstackError``) is raised, never an
        outage."""
        if isinstance(error, GuardstackError):
            raise error
        self.count += 1
        if self.signals is not None:
            attributes = {"store": self.store.name, "policy": self.policy}
            self.signals.add(STORE_ERRORS, 1, attributes)
            self.signals.event(
                "guardstack.store.error",
                {**attributes, "guardstack.layer": self.layer,
                 "error.type": type(error).__name__},
                "WARN",
            )  # fmt: skip
        now = anyio.current_time()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            verdict = "let through" if self.policy == "open" else "refused"
            message = (
                f"{self.layer}: the {self.store.name} store failed "
                f"({type(error).__name__}: {error}); calls are {verdict} (on_error={self.policy!r})"
            )
            logger.warning("%s", message)
            warnings.warn(message, GuardstackWarning, stacklevel=3)
        return self.policy == "open"

    def reason(self) -> str:
        return f"its {self.store.name} store is not answering"


class QueueMetrics:
    """A limiter's queues as metrics: ``guardstack.limiter.queue`` (the calls waiting per
    key, read at collection) and ``guardstack.limiter.wait`` (how long each call that
    queued waited, and whether it got in)."""

    __slots__ = ("keys", "layer", "signals")

    def __init__(self, signals: Signals, keys: StateKeys, layer: str) -> None:
        self.signals, self.layer = signals, layer
        self.keys = keys  # whose names the metrics' ``key`` attribute gives

    def lengths(self, queues: Mapping[str, Sized]) -> list[tuple[float, dict[str, AttributeValue]]]:
        name_of = self.keys.name_of
        return [
            (len(waiting), {"key": name_of(key), "guardstack.layer": self.layer})
            for key, waiting in list(queues.items())
        ]

    def waited(self, key: str, started: float, admitted: bool) -> None:
        self.signals.add(
            LIMITER_WAIT,
            anyio.current_time() - started,
            {
                "key": self.keys.name_of(key),
                "guardstack.layer": self.layer,
                "outcome": "admitted" if admitted else "refused",
            },
        )


class StateKeys:
    """The store key of each call — ``store_key(namespace, kind, name)``, the name being
    the call's tool or model (or the layer's shared ``key=``) — made once per name, not
    per call."""

    __slots__ = ("_keys", "_names", "fixed", "kind", "namespace", "shared", "stage")

    def __init__(
        self, namespace: str, shared: str | None, stage: StageAdapter[Any, Any, Any], kind: str
    ) -> None:
        self.namespace = namespace
        self.stage = stage
        self.kind = kind
        self.shared = shared
        self.fixed = store_key(namespace, kind, shared) if shared is not None else None
        self._keys: dict[str, str] = {}
        self._names: dict[str, str] = {}

    def __call__(self, item: Any) -> str:
        if self.fixed is not None:
            return self.fixed
        return self.of(item.key)

    def of(self, name: str) -> str:
        """The key of the tool or model ``name`` (the shared key, if the layer has one)."""
        if self.fixed is not None:
            return self.fixed
        key = self._keys.get(name)
        if key is None:
            if len(self._keys) >= _MAX_CACHED_KEYS:
                self._keys.clear()
                self._names.clear()
            key = self._keys[name] = store_key(self.namespace, self.kind, name)
            self._names[key] = name
        return key

    def name_of(self, key: str) -> str:
        """The tool or model name a key was made for (for metrics and events)."""
        if key == self.fixed and self.shared is not None:
            return self.shared
        name = self._names.get(key)
        return name if name is not None else key_parts(key)[-1]


def suspends(store: StateStore) -> bool:
    """Whether the store's operations may suspend (a remote one): then cleanup is shielded."""
    return bool(getattr(store, "suspends", True))


def check_key(plugin: str, value: object) -> str | None:
    """``key=``: ``None`` (per tool or model) or the name of one shared state."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(plugin, "key", value, "a name shared by every call, or None (per tool)")
    return non_empty_text(plugin, "key", value)


def check_store(plugin: str) -> Validator:
    """``store=``: ``None`` (the harness's) or a ``StateStore``."""

    def check(_: Any, __: Any, value: Any) -> None:
        if value is not None and not isinstance(value, StateStore):
            raise invalid(plugin, "store", value, "a StateStore (MemoryStore, RedisStore) or None")

    return check


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
