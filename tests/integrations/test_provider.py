"""What every model adapter reads from a provider the same way: an HTTP status as a
``ModelError`` code, the provider's wait, its own error message, and usage it reports —
garbage counted as *unknown*, never as a number."""

from __future__ import annotations

import email.utils
import math
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.integrations._provider import (
    MOST_TOKENS,
    error_message,
    retry_after_s,
    status_error,
    usage_reported,
)
from guardstack.pipeline import (
    MODEL_OVERLOADED,
    MODEL_RATE_LIMITED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
)


@pytest.mark.parametrize(
    ("status", "code", "waits"),
    [
        (429, MODEL_RATE_LIMITED, True),
        (529, MODEL_OVERLOADED, True),
        (408, MODEL_TIMEOUT, False),
        (500, MODEL_UNAVAILABLE, True),
        (503, MODEL_UNAVAILABLE, True),
        (409, MODEL_UNAVAILABLE, True),
        (400, MODEL_REJECTED, False),
        (401, MODEL_REJECTED, False),
    ],
)
def test_each_status_is_its_code_with_the_providers_wait_where_it_may_give_one(
    status: int, code: str, waits: bool
) -> None:
    error = status_error(status, "no", {"retry-after": "7"})
    assert error.code == code
    assert str(error) == f"{code}: HTTP {status}: no"
    assert error.retry_after_s == (7.0 if waits else None)


def test_the_wait_is_read_in_ms_seconds_or_an_http_date_and_garbage_is_none() -> None:
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_s({"retry-after": "2"}) == 2.0
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    wait = retry_after_s({"retry-after": soon})
    assert wait is not None
    assert 25 <= wait <= 31
    assert retry_after_s({"retry-after": "-5"}) == 0.0  # never a negative wait
    for garbage in ("soon", "inf", "nan", ""):
        assert retry_after_s({"retry-after": garbage}) is None
    assert retry_after_s(None) is None


class _Failed(Exception):
    def __init__(self, body: Any) -> None:
        super().__init__("the client's own words")
        self.body = body


def test_the_providers_own_message_is_preferred_and_cut() -> None:
    assert error_message(_Failed({"error": {"message": "quota exceeded"}})) == "quota exceeded"
    assert error_message(_Failed({"message": "flat body"})) == "flat body"
    assert error_message(_Failed("not a mapping")) == "the client's own words"
    assert error_message(RuntimeError()) == "RuntimeError"
    assert len(error_message(_Failed({"message": "x" * 10_000}))) <= 501


counts = st.one_of(
    st.integers(-5, 2 * MOST_TOKENS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


@given(given_in=counts, given_out=counts, cached=counts)
def test_usage_is_a_count_or_unknown_never_garbage(
    given_in: Any, given_out: Any, cached: Any
) -> None:
    usage = usage_reported(given_in, given_out, cached_input_tokens=cached)

    def whole(value: Any, required: bool) -> bool:
        if value is None:
            return not required
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            return False
        return 0 <= value <= MOST_TOKENS

    if whole(given_in, True) and whole(given_out, True) and whole(cached, False):
        assert usage is not None
        assert usage.output_tokens == int(given_out)
        assert usage.total_tokens >= int(given_out)
    else:
        assert usage is None
