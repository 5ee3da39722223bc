"""Tools from functions: schemas from annotations and docstrings, arguments checked."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, Literal, NotRequired, Required, TypedDict

import pytest

from guardstack.pipeline import (
    INVALID_ARGUMENTS,
    ConfigError,
    Harness,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    tool,
)
from tests.helpers import call


class Unit(enum.Enum):
    CELSIUS = "c"
    FAHRENHEIT = "f"


@dataclasses.dataclass
class Place:
    city: str
    country: str = "NZ"


class Window(TypedDict):
    start: int
    end: int


def forecast(
    place: Place,
    days: int = 3,
    unit: Unit = Unit.CELSIUS,
    detail: Literal["brief", "full"] = "brief",
    window: Window | None = None,
    tags: list[str] | None = None,
    scale: tuple[float, float] = (0.0, 1.0),
) -> str:
    """Forecast the weather.

    Args:
        place: Where to look.
        days: How many days ahead,
            from 1 to 14.
        unit: Degrees in C or F.
    """
    return f"{place.city}/{place.country} {days} {unit.name} {detail} {window} {tags} {scale}"


def test_the_schema_comes_from_the_annotations_and_the_docstring() -> None:
    definition = ToolDefinition.from_function(forecast, timeout_ms=5_000)
    assert definition.name == "forecast"
    assert definition.description == "Forecast the weather."
    assert definition.timeout_ms == 5_000
    schema = definition.parameters
    assert schema["required"] == ["place"]
    assert schema["additionalProperties"] is False
    properties = schema["properties"]
    assert properties["place"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "additionalProperties": False,
        "required": ["city"],
        "description": "Where to look.",
    }
    assert properties["days"] == {
        "type": "integer",
        "description": "How many days ahead, from 1 to 14.",
        "default": 3,
    }
    assert properties["unit"] == {
        "enum": ["c", "f"],
        "type": "string",
        "description": "Degrees in C or F.",
        "default": "c",
    }
    assert properties["detail"] == {"enum": ["brief", "full"], "type": "string", "default": "brief"}
    assert properties["window"]["anyOf"][1] == {"type": "null"}
    assert properties["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert properties["scale"]["prefixItems"] == [{"type": "number"}, {"type": "number"}]


async def test_arguments_are_converted_to_the_annotated_types() -> None:
    harness = Harness()
    harness.tools.register(ToolDefinition.from_function(forecast))
    arguments = {"place": {"city": "Wellington"}, "unit": "f", "days": 2.0, "scale": [1, 2]}
    result = (await harness.tools.execute(call("forecast", arguments))).result
    assert result.content == "Wellington/NZ 2 FAHRENHEIT brief None None (1.0, 2.0)"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "argument 'place' is required"),
        ({"place": {"city": 5}}, "argument 'place.city' must be text, got an integer 5"),
        ({"place": {"city": "x"}, "days": "three"}, "argument 'days' must be an integer"),
        ({"place": {"city": "x"}, "unit": "kelvin"}, "argument 'unit' must be one of"),
        ({"place": {"city": "x"}, "hours": 3}, "argument 'hours' is not an argument this takes"),
        ({"place": {"city": "x"}, "scale": [1]}, "argument 'scale' must be an array of 2 items"),
        ({"place": {"city": "x"}, "window": {"start": 1}}, "argument 'window.end' is required"),
    ],
)
async def test_bad_arguments_are_invalid_arguments_naming_the_field(
    arguments: dict[str, Any], message: str
) -> None:
    harness = Harness()
    harness.tools.register(ToolDefinition.from_function(forecast))
    result = (await harness.tools.execute(call("forecast", arguments))).result
    assert result.code == INVALID_ARGUMENTS
    assert message in result.content


class Query(TypedDict):
    q: str
    limit: NotRequired[int]


class Options(TypedDict, total=False):
    depth: Required[Annotated[int, "how deep"]]
    note: str


def lookup(query: Query, options: Options) -> str:
    return f"{query} {options}"


async def test_a_typed_dicts_required_and_not_required_keys_are_what_it_says() -> None:
    """``NotRequired``/``Required`` decide, even in a module whose annotations are strings
    (this one: Python 3.11's own ``__required_keys__`` gets them wrong there)."""
    definition = ToolDefinition.from_function(lookup)
    properties = definition.parameters["properties"]
    assert properties["query"]["properties"] == {
        "q": {"type": "string"},
        "limit": {"type": "integer"},
    }
    assert properties["query"]["required"] == ["q"]
    assert properties["options"]["properties"] == {
        "depth": {"type": "integer"},
        "note": {"type": "string"},
    }
    assert properties["options"]["required"] == ["depth"]
    harness = Harness()
    harness.tools.register(definition)
    ok = await harness.tools.execute(call("lookup", {"query": {"q": "x"}, "options": {"depth": 2}}))
    assert ok.result.content == "{'q': 'x'} {'depth': 2}"
    missing = await harness.tools.execute(call("lookup", {"query": {"q": "x"}, "options": {}}))
    assert missing.result.code == INVALID_ARGUMENTS
    assert "argument 'options.depth' is required" in missing.result.content
    wrong = await harness.tools.execute(
        call("lookup", {"query": {"q": "x", "limit": "ten"}, "options": {"depth": 1}})
    )
    assert "argument 'query.limit' must be an integer" in wrong.result.content


async def test_async_functions_the_call_parameter_and_the_decorator() -> None:
    @tool
    async def lookup(query: str, call: ToolCall) -> str:
        """Look it up.

        :param query: what to look for
        """
        return f"{query} for {call.call_id}"

    @tool(name="remove", timeout_ms=1_000, idempotent=False, destructive=True)
    def delete(path: str) -> str:
        return f"deleted {path}"

    assert isinstance(lookup, ToolDefinition)
    assert lookup.is_async
    assert lookup.parameters["properties"] == {
        "query": {"type": "string", "description": "what to look for"}
    }
    assert (delete.name, delete.timeout_ms, delete.idempotent, delete.destructive) == (
        "remove",
        1_000,
        False,
        True,
    )
    assert not delete.is_async  # a plain function runs in a worker thread
    harness = Harness(
        ScriptedModel(
            [
                ModelReply(tool_calls=[ToolCallRequest("lookup", {"query": "q"}, "c1")]),
                ModelReply(tool_calls=[ToolCallRequest("remove", {"path": "/tmp/x"}, "c2")]),
                ModelReply("done"),
            ]
        )
    )
    harness.tools.register(lookup)
    harness.tools.register(delete)
    agent = harness.loop.create("s")
    await agent.prompt("go")
    tools = [m["content"] for m in agent.session.messages() if m["role"] == "tool"]
    assert tools == ["q for c1", "deleted /tmp/x"]
    assert [s["function"]["name"] for s in harness.tools.schemas()] == ["lookup", "remove"]


class NoJson:
    pass


def positional(value: int, /) -> int:
    return value


def starred(*values: int) -> int:
    return sum(values)


def unsendable(thing: NoJson) -> str:
    return ""


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (positional, "parameter 'value' cannot be given by name"),
        (starred, "parameter 'values' cannot be given by name"),
        (unsendable, "parameter 'thing': the annotation"),
        (lambda x: x, "give"),
    ],
)
def test_a_signature_the_model_cannot_fill_is_refused_when_the_tool_is_made(
    function: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        ToolDefinition.from_function(function)


def test_keyword_arguments_take_anything_extra() -> None:
    def anything(first: str, **rest: Any) -> str:
        return first

    schema = ToolDefinition.from_function(anything).parameters
    assert "additionalProperties" not in schema
    assert list(schema["properties"]) == ["first"]


def test_the_schemas_agree_with_pydantic_ai_where_they_should() -> None:
    """Same functions, pydantic-ai's generator: the same properties, types, defaults,
    descriptions and required list. Where they differ, and why: pydantic-ai describes a
    dataclass parameter by a ``$ref`` into ``$defs`` and titles it; guardstack inlines it
    (fewer providers resolve references), so dataclass parameters are left out here."""
    pydantic_ai = pytest.importorskip("pydantic_ai")

    def search(
        query: str, limit: int = 10, exact: bool = False, sort: Literal["new", "top"] = "top"
    ) -> str:
        """Search the index.

        Args:
            query: What to look for.
            limit: At most this many hits.
        """
        return ""

    ours = ToolDefinition.from_function(search)
    theirs = pydantic_ai.Tool(search).tool_def
    assert ours.description == theirs.description
    assert ours.parameters == theirs.parameters_json_schema


async def test_a_pydantic_model_parameter_is_validated_by_pydantic() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Query(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        text: str
        limit: int = 5

    def find(query: Query) -> str:
        return f"{query.text}:{query.limit}"

    find.__annotations__["query"] = Query
    definition = ToolDefinition.from_function(find)
    assert definition.parameters["properties"]["query"]["properties"]["text"]["type"] == "string"
    harness = Harness()
    harness.tools.register(definition)
    good = await harness.tools.execute(call("find", {"query": {"text": "a"}}))
    bad = await harness.tools.execute(call("find", {"query": {"limit": 2}}))
    assert good.result.content == "a:5"
    assert bad.result.code == INVALID_ARGUMENTS
    assert "argument 'query.text'" in bad.result.content
