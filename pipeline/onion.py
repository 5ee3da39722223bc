"""The onion every stage is made of.

``Pipeline.use(layer)`` adds a layer; **the layer registered first is the
outermost**: it sees the call first and the result last (tower's ServiceBuilder,
Polly's pipeline builder). There is no other ordering API. Given::

    stage.use(total_timeout)   # 0: outermost
    stage.use(retry)           # 1
    stage.use(attempt_timeout) # 2: innermost, next to the tool

a call flows ``total_timeout -> retry -> attempt_timeout -> tool`` and the result
flows back the other way, so ``total_timeout`` bounds the whole retried operation
and ``attempt_timeout`` each attempt. ``describe()`` prints that order.

A layer is ``async (*args, call_next) -> result`` where ``call_next`` takes what the
layer was given: a plain ``async def`` or an object with ``async __call__`` and an
optional ``name``. The chain is composed once per change (``use``, ``dispose``,
``instrument``), never per call, and a layer costs one plain function call on top
of its own coroutine.

An *instrumentation hook* is applied to every layer when the chain is composed;
that is how tracing gives each layer a span without being a layer itself.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar, cast

import attrs

from guardstack.pipeline.errors import ConfigError

__all__ = ["Instrumentation", "LayerInfo", "Pipeline", "Registration", "layer_name"]

NextT = TypeVar("NextT", bound=Callable[..., Awaitable[Any]])
Layer = Callable[..., Awaitable[Any]]
#: A layer typed for one stage: ``(call, call_next) -> answer`` in that stage's types.
LayerT = TypeVar("LayerT", bound=Callable[..., Awaitable[Any]], contravariant=True)
#: The stages a layer object may say it is for (``stage="model"``), by the name a
#: ``Pipeline`` is given.
_LAYER_STAGES = frozenset({"dispatch", "model"})


@attrs.frozen
class LayerInfo:
    """Where a layer sits: its stage, its name and its index (0 = outermost)."""

    stage: str
    name: str
    index: int


class Instrumentation(Protocol):
    """Wraps every layer of a pipeline when the chain is composed."""

    def __call__(self, layer: Layer, info: LayerInfo, /) -> Layer: ...


class Registration:
    """Handle for one registration; ``dispose()`` removes it, once, idempotently."""

    __slots__ = ("_remove",)

    def __init__(self, remove: Callable[[], None]) -> None:
        self._remove: Callable[[], None] | None = remove

    @property
    def active(self) -> bool:
        return self._remove is not None

    def dispose(self) -> None:
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.dispose()


def layer_name(layer: object) -> str:
    """A layer's ``name`` attribute, else its function or class name."""
    name = getattr(layer, "name", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(layer, types.FunctionType | types.MethodType):
        return layer.__name__
    return type(layer).__name__


def _frame_owner(layer: object) -> tuple[types.CodeType | None, object]:
    """The code object that runs when ``layer`` is awaited, and the ``self`` it runs with."""
    if isinstance(layer, types.MethodType):
        return layer.__func__.__code__, layer.__self__
    if isinstance(layer, types.FunctionType):
        return layer.__code__, None
    call = getattr(type(layer), "__call__", None)  # noqa: B004 - callable objects
    return (call.__code__, layer) if isinstance(call, types.FunctionType) else (None, None)


def _bind(
    layer: Layer, call_next: Callable[..., Awaitable[Any]], arity: int
) -> Callable[..., Awaitable[Any]]:
    # A plain function, not a coroutine: awaiting the chain costs one call per layer on
    # top of the layer's own coroutine. The usual arities skip packing ``*args``.
    if arity == 1:

        def step_one(first: Any) -> Awaitable[Any]:
            return layer(first, call_next)

        return step_one
    if arity == 2:

        def step_two(first: Any, second: Any) -> Awaitable[Any]:
            return layer(first, second, call_next)

        return step_two

    def step(*args: Any) -> Awaitable[Any]:
        return layer(*args, call_next)

    return step


def _arity(function: Callable[..., Any]) -> int:
    """How many positional arguments a chain ending in ``function`` is called with.

    Cached per underlying function: ``inspect.signature`` costs tens of microseconds,
    and every registry and loop builds its stages from the same few terminals.
    """
    if isinstance(function, types.MethodType) and isinstance(function.__func__, types.FunctionType):
        arity = _function_arity(function.__func__)
        return arity - 1 if arity > 0 else arity  # ``self`` is bound already
    if isinstance(function, types.FunctionType):
        return _function_arity(function)
    return _signature_arity(function)


@functools.lru_cache(maxsize=256)
def _function_arity(function: types.FunctionType) -> int:
    return _signature_arity(function)


def _signature_arity(function: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return -1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
        return -1
    return sum(1 for parameter in parameters if parameter.kind in kinds)


@attrs.define(eq=False)
class _Entry:
    layer: Layer
    name: str


class Pipeline(Generic[NextT, LayerT]):
    """A generic onion: ``use(layer)``, ``describe()``, ``await pipeline(*args)``.

    Typed by its chain (``NextT``: what a layer's ``call_next`` is) and by the layers it
    takes (``LayerT``): a layer built for another stage is a type error at ``use``, and
    a layer object that says which stage it is for (``Retry(stage="dispatch")``) is
    refused at run time too, with what to write instead."""

    def __init__(self, terminal: NextT, *, stage: str, arity: int | None = None) -> None:
        """``arity``: how many arguments a call of this stage carries (the registry's and
        the loop's stages say theirs: ``post_execute`` and ``prompt_submit`` two, the
        rest one); read from ``terminal``'s signature when not given."""
        self.stage = stage
        self._terminal = terminal
        self._arity = _arity(terminal) if arity is None else arity
        #: Whether any layer is registered; callers may skip an empty stage entirely.
        self.layered = False
        self._entries: list[_Entry] = []
        self._hooks: list[Instrumentation] = []
        #: The stage's one entrance: the composed chain, every layer outermost first.
        #: ``await stage.entry(call)`` is ``await stage(call)`` without the extra frame;
        #: read it at each call, since ``use`` composes a new one.
        self.entry: NextT = terminal

    def use(self, layer: LayerT, *, name: str | None = None) -> Registration:
        """Add ``layer`` inside every layer registered before it."""
        if not callable(layer):
            raise TypeError(f"{self.stage}: a layer must be callable, got {layer!r}")
        built_for = getattr(layer, "stage", None)
        if built_for in _LAYER_STAGES and self.stage in _LAYER_STAGES and built_for != self.stage:
            kind = type(layer).__name__
            # the spelling mypy types for the stage: stage=MODEL (guardstack.pipeline.
            # contract), and the tool stage's default
            spelled = f"{kind}(stage=MODEL)" if self.stage == "model" else f"{kind}()"
            raise ConfigError(
                f"{self.stage} stage: {kind} is built for the {built_for} stage "
                f"(stage={built_for!r}); use {spelled} here (MODEL from "
                f"guardstack.pipeline.contract), or register it on the {built_for} stage",
                plugin=getattr(layer, "name", None),
                key="stage",
                value=built_for,
            )
        entry = _Entry(layer, name or layer_name(layer))
        self._entries.append(entry)
        self._compose()
        return Registration(lambda: self._remove(self._entries, entry))

    def instrument(self, hook: Instrumentation) -> Registration:
        """Apply ``hook`` to every layer, now and whenever the chain is recomposed."""
        self._hooks.append(hook)
        self._compose()
        return Registration(lambda: self._remove(self._hooks, hook))

    def _remove(self, items: list[Any], item: object) -> None:
        for position, candidate in enumerate(items):
            if candidate is item:
                del items[position]
                self._compose()
                return

    def _compose(self) -> None:
        self.entry = cast(NextT, self._composed(0))
        self.layered = bool(self._entries)

    def _composed(self, start: int) -> Callable[..., Awaitable[Any]]:
        """The chain of the layers from ``start`` inward, instrumented."""
        chain: Callable[..., Awaitable[Any]] = self._terminal
        for index in range(len(self._entries) - 1, start - 1, -1):
            entry = self._entries[index]
            layer = entry.layer
            for hook in self._hooks:
                layer = hook(layer, LayerInfo(self.stage, entry.name, index))
            chain = _bind(layer, chain, self._arity)
        return chain

    def chain_from(self, layer: Layer) -> Callable[..., Awaitable[Any]] | None:
        """The chain from ``layer`` (registered here) inward — the layers outside it left
        out — or ``None`` if it is not registered. For resuming a call inside a layer
        (an approval decided after a pause)."""
        start = next((i for i, entry in enumerate(self._entries) if entry.layer is layer), None)
        return None if start is None else self._composed(start)

    def __call__(self, *args: Any) -> Awaitable[Any]:
        """Run the chain: ``await stage(call)`` (hot paths call ``entry`` directly)."""
        return self.entry(*args)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The layers' names, outermost first."""
        return [entry.name for entry in self._entries]

    def describe(self) -> str:
        """One line per layer, outermost first: ``<index>. <name>[: <repr>]``."""
        lines = []
        for index, entry in enumerate(self._entries):
            line = f"{index}. {entry.name}"
            if not isinstance(entry.layer, types.FunctionType | types.MethodType):
                line += f": {entry.layer!r}"
            lines.append(line)
        return "\n".join(lines) if lines else "(no layers)"

    def blame(self, error: BaseException) -> str | None:
        """The name of the innermost layer of this pipeline that ``error`` passed through.

        Read from the traceback (a layer object is recognised by its ``self``), so it
        costs nothing until something raises. Frames run outermost first, as the
        layers do, so each frame is matched to the next layer at or after the last
        match: one function registered twice is blamed under the right name.
        """
        entries = [(entry.name, *_frame_owner(entry.layer)) for entry in self._entries]
        blamed, start = None, 0
        traceback = error.__traceback__
        while traceback is not None:
            frame = traceback.tb_frame
            for index in range(start, len(entries)):
                name, code, owner = entries[index]
                if code is frame.f_code and (owner is None or frame.f_locals.get("self") is owner):
                    blamed, start = name, index + 1
                    break
            traceback = traceback.tb_next
        return blamed
