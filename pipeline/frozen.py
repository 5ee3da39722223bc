"""Cheaper construction for the frozen attrs values made on every call.

A frozen attrs class sets each field in ``__init__`` through ``object.__setattr__``
(found by name, bound per instance): for an eleven-field ``ToolCall`` that is most of
what building one costs, and an agent step builds a dozen such values.
``quick_init`` gives a frozen, slotted attrs class an ``__init__`` with the same
signature and the same result that stores the fields by plain assignment instead.

How: the class gets an *open twin*, a subclass with no slots of its own (so the same
layout) whose ``__setattr__`` and ``__delattr__`` are ``object``'s. ``__init__`` makes
the new instance the twin (``__class__`` assignment, which Python allows between
classes of one layout), assigns each field — ``STORE_ATTR``, which the interpreter
specialises to a direct slot store — and makes it the frozen class again before
``__attrs_post_init__`` runs. The twin is never seen outside ``__init__``; an
``__init__`` that raises (a converter refusing a value) discards the half-built value
as attrs' does. An instance of a subclass is built through each slot's descriptor
instead, so it keeps its class. Everything else is attrs' own: ``attrs.evolve``,
``attrs.fields``, equality, hashing, repr, pickling and the refusal to change a field
after it is set.

It accepts only what it reproduces exactly — constant and ``Factory`` defaults,
plain converters, keyword-only fields, ``__attrs_post_init__`` — and refuses a class
with validators, a pre-init hook or a field that is not a slot, at import.

What it buys (``python -m benchmarks.construction``, on the machine the CHANGELOG
names): 0.52–0.77x attrs' own ``__init__`` for the six values an agent step builds
most, 280 ns a value on average — about 3.4 µs of a guarded step that builds a dozen.
The more fields, the more it saves: an eleven-field ``ToolCall`` costs 0.52x, 450 ns
less. (Storing through each slot's descriptor, as it did before, bought 0.81–0.85x.)
So it stays; it is the only ``__init__`` generator besides attrs'.

**What removing it would cost** (DESIGN: code generation stays only above 5 % on
``benchmarks.overhead``; ``--without-quick-init`` against none, three runs of three each,
2026-12-06): an empty ``registry.execute`` 2,340–2,360 → 2,620–2,730 ns (+11–17 %; from
22–23x a bare await to 25x, the goal's edge), ten pass-through layers +8–12 %, and an empty
``model_call`` stage with its request built 691–694 → 1,055–1,059 ns (+52 %).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

__all__ = ["copy_with", "open_twin", "passes", "quick_init"]

T = TypeVar("T")


def passes(kind: type, *converters: Callable[..., Any]) -> None:
    """Mark converters that return a value of exactly ``kind`` unchanged: ``quick_init``
    then tests the type inline and calls the converter only for anything else. (A call,
    not a decorator: mypy's attrs plugin accepts only plain functions as converters.)"""
    for converter in converters:
        converter.__quick_init_passes__ = kind  # type: ignore[attr-defined]


#: Per ``quick_init`` class: its open twin.
_TWINS: dict[type, type] = {}


def open_twin(cls: type[T]) -> type[T]:
    """The open twin of a ``quick_init`` class: make an instance with
    ``object.__new__(twin)``, assign every field, then set its ``__class__`` to ``cls``
    — for a hot copy that would otherwise pay for ``__init__``'s call (``ToolCall.resolved``).
    Every field must be assigned before the value leaves the function."""
    return _TWINS[cls]


#: Per class: each field's name and its slot's setter (for ``copy_with``).
_SETTERS: dict[type, tuple[tuple[str, Any], ...]] = {}


def copy_with(value: T, **changes: Any) -> T:
    """``value`` with ``changes``, made without running ``__init__``: no converter and no
    ``__attrs_post_init__`` runs, so each change must already be in its field's final
    form. For copies whose ``__init__`` would redo work (parse and re-serialise
    arguments) that the change cannot affect."""
    cls: Any = type(value)
    setters = _SETTERS.get(cls)
    if setters is None:
        setters = _SETTERS[cls] = tuple(
            (field.name, inspect.getattr_static(cls, field.name).__set__)
            for field in attrs.fields(cls)
        )
    copy: T = object.__new__(cls)
    for name, set_slot in setters:
        set_slot(copy, changes[name] if name in changes else getattr(value, name))
    return copy


def quick_init(cls: type[T]) -> type[T]:
    """``cls`` with an ``__init__`` that stores fields through their slot descriptors."""
    values: Any = cls  # attrs' types know no attrs class by its TypeVar
    if not attrs.has(values) or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__name__} is not a slotted attrs class")
    if hasattr(cls, "__attrs_pre_init__"):
        raise TypeError(f"quick_init: {cls.__name__} has __attrs_pre_init__")
    twin = type(
        f"_Open{cls.__name__}",
        (cls,),
        {
            "__slots__": (),
            "__setattr__": object.__setattr__,
            "__delattr__": object.__delattr__,
            "__module__": cls.__module__,
            "__doc__": f"{cls.__name__} while its __init__ runs (see guardstack.pipeline.frozen).",
        },
    )
    _TWINS[cls] = twin
    namespace: dict[str, Any] = {
        "NOTHING": attrs.NOTHING,
        "CLS": cls,
        "TWIN": twin,
        "set_class": object.__setattr__,
    }
    positional: list[str] = []
    keywords: list[str] = []
    body: list[str] = []
    #: (field name, index, value expression): each store, by assignment or by descriptor.
    stores: list[tuple[str, int, str]] = []
    for index, field in enumerate(attrs.fields(values)):
        if field.validator is not None:
            raise TypeError(f"quick_init: {cls.__name__}.{field.name} has a validator")
        slot = inspect.getattr_static(cls, field.name)
        if type(slot) is not types.MemberDescriptorType:
            raise TypeError(f"quick_init: {cls.__name__}.{field.name} is not a slot")
        namespace[f"set_{index}"] = slot.__set__
        default = field.default
        if not field.init:
            if default is attrs.NOTHING:
                continue  # set by __attrs_post_init__
            value = _default_expression(cls, field, index, namespace)
        else:
            value = field.alias
            if default is attrs.NOTHING:
                parameter = value
            elif isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                parameter = f"{value}=NOTHING"
                factory = _default_expression(cls, field, index, namespace)
                body.append(f"    if {value} is NOTHING:\n        {value} = {factory}")
            else:
                namespace[f"default_{index}"] = default
                parameter = f"{value}=default_{index}"
            (keywords if field.kw_only else positional).append(parameter)
        converter = field.converter
        if converter is not None:
            if isinstance(converter, attrs.Converter):
                raise TypeError(f"quick_init: {cls.__name__}.{field.name} has an attrs.Converter")
            namespace[f"convert_{index}"] = converter
            kind = getattr(converter, "__quick_init_passes__", None)
            if kind is None:
                value = f"convert_{index}({value})"
            else:
                namespace[f"kind_{index}"] = kind
                value = f"({value} if type({value}) is kind_{index} else convert_{index}({value}))"
        stores.append((field.name, index, value))
    body.append("    if type(self) is CLS:")
    body.append("        set_class(self, '__class__', TWIN)")
    body.extend(f"        self.{name} = {value}" for name, _, value in stores)
    body.append("        self.__class__ = CLS")
    body.append("    else:  # a subclass's instance keeps its class")
    body.extend(f"        set_{index}(self, {value})" for _, index, value in stores)
    if hasattr(cls, "__attrs_post_init__"):
        body.append("    self.__attrs_post_init__()")
    parameters = ", ".join(["self", *positional, *(["*", *keywords] if keywords else [])])
    source = f"def __init__({parameters}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(compile(source, f"<quick_init {cls.__qualname__}>", "exec"), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    #: attrs' own ``__init__``, kept so ``benchmarks/construction.py`` can weigh the two.
    setattr(values, "__init_by_attrs__", cls.__init__)  # noqa: B010
    setattr(values, "__init__", init)  # noqa: B010 - a class's method, replaced on purpose
    return cls


def _default_expression(cls: type, field: Any, index: int, namespace: dict[str, Any]) -> str:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            raise TypeError(f"quick_init: {cls.__name__}.{field.name}'s factory takes self")
        namespace[f"factory_{index}"] = default.factory
        return f"factory_{index}()"
    namespace[f"default_{index}"] = default
    return f"default_{index}"
