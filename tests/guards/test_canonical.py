"""Canonical arguments reproduce JavaScript's JSON.stringify(deepKeySort(x))."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.guards import canonical_json
from guardstack.guards.canonical import _write, js_number, utf16_length, utf16_prefix


@pytest.mark.parametrize(
    ("number", "javascript"),
    [
        (1.0, "1"),
        (-0.0, "0"),
        (1.5, "1.5"),
        (0.1, "0.1"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (123456789012345680000.0, "123456789012345680000"),
        (1e21, "1e+21"),
        (1.5e300, "1.5e+300"),
        (2.0**60, "1152921504606847000"),
        (5e-324, "5e-324"),
        (math.nan, "null"),
        (math.inf, "null"),
        (-math.inf, "null"),
        (10**30, "1000000000000000000000000000000"),
        (-2.5e-8, "-2.5e-8"),
    ],
)
def test_numbers_print_as_javascript_prints_them(number: float, javascript: str) -> None:
    assert js_number(number) == javascript


def test_keys_sort_deeply_with_integer_like_keys_first() -> None:
    value = {"b": 1, "a": {"z": None, "10": 1, "2": 2, "é": "ü", "B": True}, "01": 0, "1": [3, 1]}
    assert canonical_json(value) == (
        '{"1":[3,1],"01":0,"a":{"2":2,"10":1,"B":true,"z":null,"é":"ü"},"b":1}'
    )


def test_strings_escape_like_json_stringify() -> None:
    assert canonical_json('quote " slash \\ tab \t nul \x00 ü 😀') == (
        '"quote \\" slash \\\\ tab \\t nul \\u0000 ü 😀"'
    )
    assert canonical_json("\ud800") == '"\\ud800"'


def test_odd_python_values_are_deterministic_not_errors() -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    assert canonical_json(cyclic) == '[1,"[Circular]"]'
    assert canonical_json({3, 1, 2}) == canonical_json(frozenset({2, 3, 1})) == "[1,2,3]"
    assert canonical_json(b"\x01\xff") == '"01ff"'
    assert canonical_json((1, 2)) == canonical_json([1, 2])

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

        __slots__ = ()

    assert canonical_json(Broken()) == '"<unprintable Broken>"'
    deep: Any = []
    for _ in range(500):
        deep = [deep]
    assert canonical_json(deep).count("[Too deep]") == 1


def test_utf16_lengths_count_astral_characters_twice() -> None:
    assert utf16_length("a😀") == 3
    assert utf16_prefix("a😀b", 2) == "a"  # never half a surrogate pair
    assert utf16_prefix("a😀b", 3) == "a😀"


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(value=st.dictionaries(st.text(), json_like, max_size=5), seed=st.randoms())
def test_key_order_never_changes_the_canonical_form(value: dict[str, Any], seed: Any) -> None:
    keys = list(value)
    seed.shuffle(keys)
    assert canonical_json({key: value[key] for key in keys}) == canonical_json(value)


flat_keys = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=4) | st.text(max_size=3)
flat_values = st.none() | st.booleans() | st.integers() | st.text() | st.floats()


@given(value=st.dictionaries(flat_keys | st.integers(0, 20).map(str), flat_values, max_size=6))
def test_a_flat_object_is_written_as_the_general_writer_writes_it(value: dict[str, Any]) -> None:
    """The fast path for flat arguments (ASCII keys; text, integers, booleans, nulls) and
    the general writer agree, including on what the fast path hands over to it."""
    parts: list[str] = []
    _write(value, parts, set(), 0)
    assert canonical_json(value) == "".join(parts)
