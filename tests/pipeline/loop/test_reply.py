"""What the loop asks of a model's reply before it logs it: the right types (else a
``TypeError`` naming what is wrong), and one id per call."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import ModelReply, ToolCallRequest, Usage
from guardstack.pipeline.loop.reply import checked_reply, with_unique_ids


def test_a_well_formed_reply_is_returned_as_it_is() -> None:
    reply = ModelReply("hi", [ToolCallRequest("t", {}, "c1")], usage=Usage(1, 2), model="m")
    assert checked_reply(reply) is reply


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ("just text", "the model returned 'just text', not a ModelReply"),
        (ModelReply(3), "the model's reply text is int, not str"),  # type: ignore[arg-type]
        (ModelReply("x", usage={"in": 1}), "usage is {'in': 1}, not a Usage"),  # type: ignore[arg-type]
        (ModelReply("x", model=7), "the model's reply model is int, not str"),  # type: ignore[arg-type]
        (ModelReply("x", tool_calls=["t"]), "tool_calls are not all ToolCallRequest"),  # type: ignore[list-item]
        (ModelReply("x", thinking_blocks=[{"n": float("nan")}]), "thinking_blocks are not JSON"),
    ],
)
def test_a_malformed_reply_is_refused_naming_what_is_wrong(reply: Any, said: str) -> None:
    with pytest.raises(TypeError) as raised:
        checked_reply(reply)
    assert said in str(raised.value)


ids = st.lists(st.sampled_from(["", "a", "b", "a"]), max_size=6)


@given(given_ids=ids)
def test_every_call_gets_an_id_of_its_own_and_good_ids_are_kept(given_ids: list[str]) -> None:
    requests = tuple(ToolCallRequest("t", {}, call_id) for call_id in given_ids)
    unique = with_unique_ids(requests, 2, 3)
    made = [request.call_id for request in unique]
    assert len(set(made)) == len(made) == len(requests)
    assert all(made)
    first_seen: set[str] = set()
    for given_id, request in zip(given_ids, unique, strict=True):
        if given_id and given_id not in first_seen:
            assert request.call_id == given_id  # the first use of an id keeps it
        first_seen.add(given_id)
    if len(requests) > 1:
        assert all(
            m == g or m.startswith("call_2_3_") for m, g in zip(made, given_ids, strict=True)
        )
