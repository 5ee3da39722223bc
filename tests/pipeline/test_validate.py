"""The checks every layer's constructor uses: one wording for each kind of value, the
plugin and key named, values cut short, and a "did you mean" for a near miss."""

from __future__ import annotations

import fnmatch
import math
import warnings
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import ConfigError
from guardstack.pipeline.validate import (
    MAX_VALUE_CHARS,
    boolean,
    codes,
    compile_patterns,
    cut,
    did_you_mean,
    in_ms,
    integer,
    non_empty_text,
    number,
    patterns,
    stage,
)


@pytest.mark.parametrize(
    ("check", "value", "said"),
    [
        (lambda v: integer("retry", "attempts", v), True, "`attempts` must be an integer >= 1"),
        (lambda v: integer("retry", "attempts", v), 0, "an integer >= 1, got 0"),
        (lambda v: number("timeout", "ms", v), math.nan, "a number >= 0, got nan"),
        (lambda v: boolean("x", "shadow", v), 1, "`shadow` must be true or false, got 1"),
        (lambda v: non_empty_text("x", "name", v), "", "a non-empty string"),
        (lambda v: patterns("x", "tools", v), "search", "a list of tool-name patterns"),
        (lambda v: patterns("x", "tools", v), ["ok", ""], "a list of tool-name patterns"),
        (lambda v: codes("x", "on", v), [], "a non-empty list of result codes"),
        (lambda v: stage("x", v), "dispatc", "'dispatch' (tool calls) or 'model'"),
    ],
)
def test_a_bad_value_is_refused_naming_plugin_key_and_value(
    check: Any, value: Any, said: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        check(value)
    assert said in str(raised.value)
    assert str(raised.value).split(":")[0] in {"retry", "timeout", "x"}


def test_good_values_come_back_in_their_form() -> None:
    assert integer("x", "n", 3) == 3
    assert number("x", "n", 0.5) == 0.5
    assert patterns("x", "tools", ["a*", "b"]) == ("a*", "b")
    assert codes("x", "on", "TOOL_TIMEOUT") == frozenset({"TOOL_TIMEOUT"})
    assert stage("x", "model") == "model"


def test_a_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(ConfigError) as raised:
        integer("x", "n", "y" * 10_000)
    assert len(str(raised.value)) < MAX_VALUE_CHARS + 80
    assert len(cut("y" * 10_000)) <= MAX_VALUE_CHARS + 1


def test_did_you_mean_names_the_closest_known_name_only() -> None:
    assert did_you_mean("atempts", ["attempts", "backoff_ms"]) == " (did you mean 'attempts'?)"
    assert did_you_mean("zzz", ["attempts"]) == ""
    assert did_you_mean(3, ["attempts"]) == ""


def test_an_old_seconds_keyword_warns_naming_its_millisecond_replacement() -> None:
    assert in_ms("redis-store", "idle_ttl", None, 5_000) == 5_000
    with pytest.warns(DeprecationWarning, match=r"idle_ttl_s is deprecated .* idle_ttl_ms=1500"):
        assert in_ms("redis-store", "idle_ttl", 1.5, 5_000) == 1_500
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match="idle_ttl_s"):
            in_ms("redis-store", "idle_ttl", -1, 5_000)


names = st.text(alphabet="ab*.?[", max_size=6)


@given(pattern_list=st.lists(names.filter(bool), min_size=1, max_size=3), name=names)
def test_compiled_patterns_match_a_whole_name_as_star_globs(
    pattern_list: list[str], name: str
) -> None:
    """Only ``*`` is special (any run of characters); ``?``, ``[`` and ``.`` are literal."""
    compiled = compile_patterns(tuple(pattern_list))
    assert compiled is not None
    expected = any(
        fnmatch.fnmatchcase(name, "".join("*" if c == "*" else f"[{c}]" for c in pattern))
        for pattern in pattern_list
    )
    assert bool(compiled.fullmatch(name)) == expected
    assert compile_patterns(()) is None
