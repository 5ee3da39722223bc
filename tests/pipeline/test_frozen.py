"""``quick_init`` builds the same values attrs' own ``__init__`` does, only cheaper."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import ToolCall, ToolDefinition, ToolOutcome, ToolResult
from guardstack.pipeline.frozen import quick_init
from guardstack.pipeline.model import ModelReply, ToolCallRequest, Usage
from guardstack.pipeline.session import AssistantMessage, ToolResultEvent


def _twins() -> tuple[type, type]:
    """One class definition, made twice: attrs' own ``__init__`` and ``quick_init``'s."""

    def define() -> type:
        @attrs.frozen
        class Value:
            first: Any
            second: int = attrs.field(default=2, converter=int)
            items: tuple[Any, ...] = attrs.field(factory=list, converter=tuple)
            hidden: str = attrs.field(init=False, default="h")
            derived: Any = attrs.field(init=False)
            keyword: Any = attrs.field(default=None, kw_only=True)
            _private: Any = attrs.field(default=0)

            def __attrs_post_init__(self) -> None:
                object.__setattr__(self, "derived", (self.first, self.second))

        return Value

    return define(), quick_init(define())


PLAIN, QUICK = _twins()

arguments = st.fixed_dictionaries(
    {"first": st.integers() | st.text(max_size=3)},
    optional={
        "second": st.integers(-5, 5) | st.just("7") | st.just("x"),
        "items": st.lists(st.integers(), max_size=3),
        "keyword": st.integers(),
        "private": st.integers(),
        "hidden": st.just("not an argument"),
        "unknown": st.just(1),
    },
)


def _build(cls: type, given: dict[str, Any], positional: bool) -> Any:
    try:
        if positional:
            named = dict(given)
            first = named.pop("first")
            return cls(first, **named)
        return cls(**given)
    except Exception as error:  # the same error, type and message (bar the class name)
        return (type(error), str(error).replace("quick_init ", ""))


class _Sub(QUICK):  # type: ignore[misc, valid-type]
    """A subclass of a ``quick_init`` class (attrs' own, not re-decorated)."""

    __slots__ = ()


@pytest.mark.parametrize("cls", [QUICK, _Sub], ids=["class", "subclass"])
@given(given=arguments, positional=st.booleans())
def test_the_same_value_or_the_same_error_as_attrs_own_init(
    cls: type, given: dict[str, Any], positional: bool
) -> None:
    """A subclass's instance is built through its slots' descriptors, keeping its class."""
    plain, quick = _build(PLAIN, given, positional), _build(cls, given, positional)
    if isinstance(plain, tuple):
        assert isinstance(quick, tuple)
        assert quick[0] is plain[0]
    else:
        assert attrs.asdict(quick) == attrs.asdict(plain)
        assert repr(quick).split("(", 1)[1] == repr(plain).split("(", 1)[1]
        assert type(quick) is cls  # sealed: the open twin never leaves ``__init__``
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(quick, "first", None)  # noqa: B010
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            delattr(quick, "first")


calls = st.builds(
    ToolCall,
    st.text(max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2) | st.text(max_size=5),
    st.text(max_size=5),
    attempt=st.integers(1, 5),
    conversation=st.none() | st.text(max_size=3),
    hedge=st.integers(0, 3),
    priority=st.none() | st.integers(-3, 3),
    tenant=st.none() | st.text(max_size=3),
    on_progress=st.none() | st.just(print),
)


@given(call=calls)
def test_resolved_is_the_same_call_with_its_tool_and_nothing_else_changed(call: ToolCall) -> None:
    """``resolved`` copies field by field without ``__init__``: a field added to
    ``ToolCall`` and forgotten there fails here."""
    definition = ToolDefinition("t", lambda arguments, call: "ok")
    resolved = call.resolved(definition)
    assert type(resolved) is ToolCall
    assert resolved.tool is definition
    for field in attrs.fields(ToolCall):
        if field.name != "tool":
            assert getattr(resolved, field.name) is getattr(call, field.name), field.name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        resolved.tool = None  # type: ignore[misc]


def test_the_signature_is_attrs_own() -> None:
    assert inspect.signature(QUICK) == inspect.signature(PLAIN)
    assert str(inspect.signature(ToolCall)).startswith("(name: 'str', arguments:")


@pytest.mark.parametrize(
    "value",
    [
        ToolCall("t", {"q": 1}, "c1", attempt=2),
        ToolResult("ok", value={"raw": 1}),
        ToolOutcome(ToolResult("ok")),
        Usage(1, 2, 3),
        ModelReply("hi", [ToolCallRequest("t", '{"a": 1}', "c")], usage=Usage(1, 1)),
        AssistantMessage(1, 1, "hi", (ToolCallRequest("t", {}, "c"),)),
        ToolResultEvent(1, 1, "c", ToolResult("ok")),
    ],
    ids=lambda value: type(value).__name__,
)
def test_the_values_stay_frozen_evolvable_and_picklable(value: Any) -> None:
    first = attrs.fields(type(value))[0].name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(value, first, None)
    compared_by_identity = type(value).__eq__ is object.__eq__  # type: ignore[comparison-overlap]
    assert attrs.evolve(value) == value or compared_by_identity
    if not isinstance(value, ToolCall):  # a call holds its agent: not meant to be pickled
        assert pickle.loads(pickle.dumps(value)) == value


def test_a_class_it_cannot_reproduce_is_refused_at_import() -> None:
    @attrs.frozen
    class Checked:
        value: int = attrs.field(validator=attrs.validators.instance_of(int))

    with pytest.raises(TypeError, match="validator"):
        quick_init(Checked)

    class NotAttrs:
        pass

    with pytest.raises(TypeError, match="not a slotted attrs class"):
        quick_init(NotAttrs)

    @attrs.frozen
    class SelfFactory:
        value: int = attrs.field(default=attrs.Factory(lambda self: 1, takes_self=True))

    with pytest.raises(TypeError, match="takes self"):
        quick_init(SelfFactory)


@pytest.mark.parametrize("arguments", ['{"b": 1, "a": [2]}', {"q": "x"}, "not json", ""])
def test_a_request_under_another_id_is_the_request_made_with_that_id(arguments: Any) -> None:
    moved = ToolCallRequest("t", arguments, "c1").with_call_id("c2")
    made = ToolCallRequest("t", arguments, "c2")
    assert moved == made
    assert (moved.arguments_json, moved.raw_arguments) == (made.arguments_json, made.raw_arguments)
