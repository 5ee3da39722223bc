"""What ``LoopDetector`` treats as volatile: values by their form, never by their key's
name — a time of day, an epoch, an id; free text folded; a plain date kept."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.guards.volatile import (
    arguments_key,
    is_acknowledgement,
    is_empty,
    is_pending,
    result_key,
    top_level,
    volatile_value,
)


@pytest.mark.parametrize(
    ("value", "volatile"),
    [
        ("2024-05-13T10:00:00Z", True),
        ("550e8400-e29b-41d4-a716-446655440000", True),
        (1_717_000_000, True),  # an epoch, in seconds
        (1_717_000_000_000, True),  # and in milliseconds
        ("2024-05-13", False),  # a day-by-day search differs in it
        ("/var/log/app.log", False),
        ("search", False),
        (True, False),
        (42, False),
    ],
)
def test_a_value_is_volatile_by_its_form(value: Any, volatile: bool) -> None:
    assert volatile_value(value) is volatile


def test_repeats_that_differ_only_in_volatile_parts_share_a_key() -> None:
    first = arguments_key({"q": "Hello  World", "when": 1_717_000_000}, None, True)
    again = arguments_key({"when": 1_717_000_999, "q": "hello world"}, None, True)
    other_day = arguments_key({"q": "hello world", "day": "2024-05-14"}, None, True)
    assert first == again
    assert other_day != arguments_key({"q": "hello world", "day": "2024-05-13"}, None, True)
    exact = arguments_key({"q": "Hello  World"}, None, False)
    assert exact != arguments_key({"q": "hello world"}, None, False)  # no folding asked


def test_a_result_masks_times_ids_and_durations() -> None:
    assert result_key("1 failed in 0.53s") == result_key("1 failed in 0.61s")
    assert result_key("at 2024-05-13T10:00:00Z id 550e8400-e29b-41d4-a716-446655440000") == (
        "at <time> id <id>"
    )
    assert result_key("2 failed") != result_key("1 failed")


@pytest.mark.parametrize(
    ("text", "empty", "acknowledged", "pending"),
    [
        ("[]", True, False, False),
        ("no results", True, False, False),
        ("ok", False, True, False),
        ("job is running", False, False, True),
        ("3 results: a, b, c", False, False, False),
    ],
)
def test_the_kinds_of_result_the_rules_read(
    text: str, empty: bool, acknowledged: bool, pending: bool
) -> None:
    assert (is_empty(text), is_acknowledgement(text), is_pending(text)) == (
        empty,
        acknowledged,
        pending,
    )


def test_top_level_arguments_are_scalars_or_their_canonical_text() -> None:
    assert top_level({"a": [1], "b": 2}) == {"a": "[1]", "b": 2}
    assert top_level("not an object") is None


@pytest.mark.parametrize(
    "note",
    [
        '\n\nPotential loop detected: "Bash" returned the same result 3 times in a row.',
        '\n\nPotential loop detected: "Bash" returned the same result 4 times in a row.',
        "\n\nYou are repeating the exact same tool call with identical arguments.",
        "\nError: tool-call-limit: tool call limit reached: Bash already called 7 times",
    ],
)
def test_guardstacks_own_words_in_a_result_are_not_progress(note: str) -> None:
    """Reported (#66): through both gateways, the MCP gateway's notes and denials — their
    text carrying a growing count — made each result look new to the model proxy's loop
    detector, and Claude Code was stopped after 13 calls where 9 were expected."""
    assert result_key("a.py\nb.py" + note) == result_key("a.py\nb.py")
    structured = '{"out": "a.py", "guardstack_note": "' + note.strip().replace('"', '\\"') + '"}'
    assert result_key(structured) == result_key('{"out": "a.py"}')


def test_a_tools_own_text_that_mentions_a_loop_stays() -> None:
    assert result_key("the loop ran 3 times") != result_key("the loop ran 4 times")
