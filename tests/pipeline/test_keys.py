"""Store keys from typed parts: no two part lists give one key, whatever the names hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline.contract import key_parts, store_key

#: Names as hostile as they come: separators, braces, percent signs, newlines, lone
#: surrogates, the empty string.
names = st.text(
    alphabet=st.one_of(
        st.sampled_from(":{}%\n\r\x00 /\\-_.~"),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates
        st.characters(),
    ),
    max_size=12,
)


@given(st.lists(names, max_size=6))
def test_a_key_gives_back_its_parts(parts: list[str]) -> None:
    assert key_parts(store_key(*parts)) == (parts or [""])


@given(st.lists(names, max_size=5), st.lists(names, max_size=5))
def test_two_different_part_lists_never_give_one_key(first: list[str], second: list[str]) -> None:
    if first != second and (first, second) not in (([], [""]), ([""], [])):
        assert store_key(*first) != store_key(*second)


def test_the_collisions_users_met_are_gone() -> None:
    # a tool named "report:limit" and the adaptive limit of "report"
    assert store_key("ns", "slots", "report:limit") != store_key("ns", "limit", "report")
    assert store_key("ns", "breaker", "x:outcomes") != store_key("ns", "breaker", "x") + ":outcomes"
    # an owner's part never leaks into another's: a Redis Cluster hash tag stays whole
    assert "{" not in store_key("{tag}", "x")
    assert "}" not in store_key("a}", "b")
    assert store_key("a", "b\nc") == "a:b%0Ac"


def test_long_and_unencodable_names_are_keys_like_any_other() -> None:
    long_name = "é" * 10_000
    assert key_parts(store_key("ns", long_name)) == ["ns", long_name]
    surrogate = "tool\udc80"
    key = store_key("ns", surrogate)
    assert key.isascii()  # a Redis client can send it
    assert key_parts(key) == ["ns", surrogate]
    assert store_key("rate-limit", "bucket", "search") == "rate-limit:bucket:search"  # readable


def test_a_part_that_is_not_text_is_refused() -> None:
    import pytest

    with pytest.raises(TypeError, match="parts are text, got int"):
        store_key("ns", 1)  # type: ignore[arg-type]
