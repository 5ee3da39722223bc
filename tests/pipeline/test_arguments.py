"""A tool call's arguments: a JSON object or an ``INVALID_ARGUMENTS`` answer, decided
the same way ``json`` itself would — never by raising."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import INVALID_ARGUMENTS
from guardstack.pipeline.arguments import check_arguments

#: Leaves JSON holds, and some it does not (each round-trips differently or not at all).
_GOOD_LEAVES = st.none() | st.booleans() | st.integers() | st.text(max_size=4)
_BAD_LEAVES = (
    st.just(math.nan)
    | st.just(math.inf)
    | st.binary(max_size=3)
    | st.frozensets(st.integers(), max_size=2)
    | st.just(object())
)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
_KEYS = st.text(max_size=3) | st.integers(0, 3) | st.booleans()
values = st.recursive(
    _GOOD_LEAVES | _FLOATS | _BAD_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=8,
)


def _json_holds(value: object) -> bool:
    """The oracle: ``json`` writes it, and reading it back gives the same value (a
    non-text key or a NaN does not come back as it went)."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return bool(json.loads(text) == value)


@given(arguments=st.dictionaries(_KEYS, values, max_size=4) | values)
def test_arguments_pass_exactly_when_they_are_a_json_object(arguments: Any) -> None:
    answer = check_arguments(arguments)
    holds = isinstance(arguments, dict) and _json_holds(arguments)
    assert (answer is None) == holds, answer
    if answer is not None:
        assert answer.is_error
        assert answer.code == INVALID_ARGUMENTS
        assert answer.content.startswith("Error: tool call arguments must be")


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ('{"q": 1}', "got the text '{\"q\": 1}'"),
        ("x" * 200, "…"),
        ([1, 2], "got list"),
        ({"n": 10**5000}, "an integer too large for JSON"),
        ({"x": {1: "a"}}, "key 1 is not a string"),
        ({"f": math.nan}, "nan is not a JSON number"),
        ({"s": {1, 2}}, "a set value is not JSON"),
    ],
)
def test_what_is_wrong_is_said(arguments: Any, said: str) -> None:
    answer = check_arguments(arguments)
    assert answer is not None
    assert said in answer.content


def test_too_deep_and_circular_arguments_are_answered_not_raised() -> None:
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(70):
        inner["a"] = {}
        inner = inner["a"]
    circular: dict[str, Any] = {}
    circular["self"] = circular
    for arguments in (deep, circular):
        answer = check_arguments(arguments)
        assert answer is not None
        assert "nested deeper than 64 levels (or circular)" in answer.content


class _Hostile(Mapping[str, Any]):
    """A mapping whose iteration raises: reading it must not."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("no")

    def __len__(self) -> int:
        return 1


def test_a_mapping_that_raises_when_read_is_answered() -> None:
    answer = check_arguments(_Hostile())
    assert answer is not None
    assert "reading them raised RuntimeError" in answer.content
