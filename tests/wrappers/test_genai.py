"""A chat request and a reply in the GenAI semantic conventions' message shapes (parts,
not OpenAI's ``content``/``tool_calls``): JSON a backend validates, texts cut one by
one, never raising on what a model or a tool sent."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import ModelReply, ToolCallRequest
from guardstack.wrappers._genai import as_json, genai_input, genai_output


def _short(text: str) -> str:
    return text[:5]


def test_each_role_becomes_its_parts() -> None:
    system, chat = genai_input(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "find it"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "think",
                "tool_calls": [
                    {"id": "c1", "function": {"name": "search", "arguments": '{"q": 1}'}},
                    {"id": "c2", "function": {"name": "raw", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": {"rows": 3}},
        ],
        _short,
    )
    assert system == [{"type": "text", "content": "be br"}]
    assert [message["role"] for message in chat] == ["user", "assistant", "tool"]
    assistant = chat[1]["parts"]
    assert assistant == [
        {"type": "reasoning", "content": "think"},
        {"type": "tool_call", "id": "c1", "name": "search", "arguments": {"q": 1}},
        {"type": "tool_call", "id": "c2", "name": "raw", "arguments": "not json"},
    ]
    assert chat[2]["parts"] == [{"type": "tool_call_response", "id": "c1", "response": '{"row'}]


def test_a_reply_is_one_assistant_message_with_its_finish_reason() -> None:
    [message] = genai_output(
        ModelReply("done", [ToolCallRequest("t", {"a": 1}, "c")], reasoning="hm"), _short
    )
    assert message["role"] == "assistant"
    assert message["finish_reason"] == "tool_call"
    parts: Any = message["parts"]
    assert [part["type"] for part in parts] == ["reasoning", "text", "tool_call"]


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@given(messages=st.lists(json_like, max_size=6))
def test_whatever_the_messages_hold_the_result_is_json_and_never_raises(
    messages: list[Any],
) -> None:
    system, chat = genai_input(messages, _short)
    json.dumps([system, chat])
    for message in chat:
        for part in message["parts"]:  # type: ignore[attr-defined]
            assert part["type"] in {"text", "reasoning", "tool_call", "tool_call_response"}


def test_as_json_never_raises() -> None:
    circular: list[Any] = []
    circular.append(circular)
    assert as_json("text") == "text"
    assert as_json({"a": 1}) == '{"a": 1}'
    assert as_json(circular).startswith("[[")
