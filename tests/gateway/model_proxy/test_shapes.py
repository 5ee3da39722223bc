"""What each provider API types in a request (``model_proxy/shapes.py``): a property
walks each API's shape over well-formed requests, puts a value of a kind the provider
refuses at any typed place, and the check names that place; well-formed requests —
and what the providers accept beyond the shapes (unknown fields, unknown block types,
``null`` for an optional field, ``system`` items inside Anthropic's ``messages``) —
pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.gateway.model_proxy import shapes
from guardstack.gateway.model_proxy.responses import RESPONSES
from guardstack.gateway.model_proxy.wires import ANTHROPIC, OPENAI, Malformed, Wire

CHAT_REQUEST: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "List files."}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ],
    "tools": [{"type": "function", "function": {"name": "ls", "parameters": {}}}],
    "max_tokens": 100,
    "temperature": 0.2,
    "stream": True,
    "stream_options": {"include_usage": True},
}
MESSAGES_REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 32_000,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "x"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "List files."}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"c": "ls"}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "a"}],
                }
            ],
        },
    ],
    "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
    "stream": True,
}
RESPONSES_REQUEST: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
        {"type": "function_call", "call_id": "f1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "f1", "output": "a.py"},
    ],
    "tools": [{"type": "function", "name": "shell", "parameters": {}}],
    "stream": True,
    "prompt_cache_key": "0199-abc",
}
CASES: list[tuple[Wire, shapes.Shape, dict[str, Any]]] = [
    (OPENAI, shapes.CHAT, CHAT_REQUEST),
    (ANTHROPIC, shapes.MESSAGES, MESSAGES_REQUEST),
    (RESPONSES, shapes.RESPONSES, RESPONSES_REQUEST),
]


def typed_places(data: Any, shape: shapes.Shape, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in ``data`` whose kind ``shape`` types (as paths of keys and indexes)."""
    places = [at] if at else []
    if isinstance(data, dict):
        known = [shape]
        kind = data.get("type", shape.default)
        if shape.variants and isinstance(kind, str) and kind in shape.variants:
            known.append(shape.variants[kind])
        for each in known:
            for name, field in each.fields.items():
                if data.get(name) is not None:
                    places += typed_places(data[name], field, (*at, name))
    elif isinstance(data, list) and shape.items is not None:
        for index, item in enumerate(data):
            places += typed_places(item, shape.items, (*at, index))
    return places


def shape_at(shape: shapes.Shape, data: Any, path: tuple[Any, ...]) -> shapes.Shape:
    for step in path:
        if isinstance(step, int):
            assert shape.items is not None
            shape, data = shape.items, data[step]
            continue
        kind = data.get("type", shape.default)
        variant = shape.variants.get(kind) if isinstance(kind, str) else None
        if variant is not None and step in variant.fields:
            shape = variant.fields[step]
        else:
            shape = shape.fields[step]
        data = data[step]
    return shape


def written(path: tuple[Any, ...]) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


TEXT_5 = {"role": "user", "content": [{"type": "text", "text": 5}]}
INPUT_TEXT_5 = {"role": "user", "content": [{"type": "input_text", "text": 5}]}

WRONG = {
    "text": st.sampled_from([5, True, {}, []]),
    "int": st.sampled_from(["5", 1.5, 10**400, True]),
    "number": st.sampled_from(["0.5", float("inf"), 10**400, False]),
    "bool": st.sampled_from(["true", 1, 0]),
    "object": st.sampled_from([1, "x", [], True]),
    "list": st.sampled_from([1, {}, True]),
}


@pytest.mark.parametrize(
    ("wire", "shape", "request_body"), CASES, ids=["chat", "messages", "responses"]
)
def test_a_well_formed_request_passes(
    wire: Wire, shape: shapes.Shape, request_body: dict[str, Any]
) -> None:
    wire.check(copy.deepcopy(request_body))


@pytest.mark.parametrize(
    ("wire", "shape", "request_body"), CASES, ids=["chat", "messages", "responses"]
)
@given(data=st.data())
def test_a_value_of_a_kind_the_provider_refuses_is_named_where_it_is(
    wire: Wire, shape: shapes.Shape, request_body: dict[str, Any], data: st.DataObject
) -> None:
    body = copy.deepcopy(request_body)
    places = typed_places(body, shape)
    path = data.draw(st.sampled_from(places))
    expected = shape_at(shape, body, path)
    wrong = data.draw(
        st.one_of(
            *(WRONG[kind] for kind in ("text", "int", "number", "bool", "object", "list"))
        ).filter(
            # a kind it refuses (not an object of its kind missing a field)
            lambda value: (
                shapes.conform(value, shapes.one_of(*expected.kinds, minimum=expected.minimum))
                is not None
            )
        )
    )
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = wrong
    with pytest.raises(Malformed) as raised:
        wire.check(body)
    assert str(raised.value).startswith(f"{written(path)} must be")


@pytest.mark.parametrize(
    ("wire", "body"),
    [
        # Claude Code's default model: system items inside messages (Anthropic accepts them)
        (ANTHROPIC, {**MESSAGES_REQUEST, "messages": [{"role": "system", "content": "x"},
                                                      *MESSAGES_REQUEST["messages"]]}),
        # a block type the shape does not know, and an unknown field
        (ANTHROPIC, {**MESSAGES_REQUEST, "context_management": {"edits": []},
                     "messages": [{"role": "user", "content": [{"type": "container_upload",
                                                                "file_id": 5}]}]}),
        (OPENAI, {**CHAT_REQUEST, "max_tokens": None, "web_search_options": {}}),
        (RESPONSES, {**RESPONSES_REQUEST, "input": "just text", "text": {"verbosity": "low"}}),
        (RESPONSES, {**RESPONSES_REQUEST, "input": [{"type": "reasoning", "summary": []}]}),
    ],
)  # fmt: skip
def test_what_the_provider_accepts_beyond_the_shapes_passes(
    wire: Wire, body: dict[str, Any]
) -> None:
    wire.check(body)


@pytest.mark.parametrize(
    ("wire", "body", "says"),
    [
        (OPENAI, {**CHAT_REQUEST, "max_tokens": 10**400}, "max_tokens must be"),
        (ANTHROPIC, {**MESSAGES_REQUEST, "max_tokens": 10**400}, "max_tokens must be"),
        (RESPONSES, {**RESPONSES_REQUEST, "max_output_tokens": 10**400}, "max_output_tokens"),
        (OPENAI, {**CHAT_REQUEST, "tools": [1]}, "tools[0] must be an object"),
        (ANTHROPIC, {**MESSAGES_REQUEST, "tools": [1]}, "tools[0] must be an object"),
        (RESPONSES, {**RESPONSES_REQUEST, "tools": [1]}, "tools[0] must be an object"),
        (OPENAI, {**CHAT_REQUEST, "messages": [TEXT_5]}, "messages[0].content[0].text must be"),
        (ANTHROPIC, {**MESSAGES_REQUEST, "messages": [TEXT_5]}, "messages[0].content[0].text"),
        (RESPONSES, {**RESPONSES_REQUEST, "input": [INPUT_TEXT_5]}, "input[0].content[0].text"),
        (ANTHROPIC, {**MESSAGES_REQUEST, "max_tokens": 0}, "max_tokens must be a whole number of"),
        (OPENAI, {**CHAT_REQUEST, "messages": []}, "messages must be a non-empty list"),
    ],
)  # fmt: skip
def test_the_reported_cases_are_the_clients_error(
    wire: Wire, body: dict[str, Any], says: str
) -> None:
    with pytest.raises(Malformed) as raised:
        wire.check(body)
    assert says in str(raised.value)
