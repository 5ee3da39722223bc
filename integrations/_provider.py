"""What every provider adapter needs the same way: error text, ``retry-after``, deltas.

The official clients of OpenAI and Anthropic (and LiteLLM, which wraps them) share an
error-body shape (``{"error": {"message": …}}``) and the ``retry-after-ms`` /
``retry-after`` headers; the adapters read them here, and report streamed text to
``on_delta`` here, so each adapter keeps only its provider's own wire format.
"""

from __future__ import annotations

import email.utils
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from guardstack.pipeline import MODEL_FAILED, ModelError
from guardstack.pipeline.validate import cut

__all__ = [
    "GARBAGE",
    "OnDelta",
    "check_on_delta",
    "error_message",
    "report_delta",
    "retry_after_s",
    "unreadable",
]

OnDelta = Callable[[str], object] | Callable[[str], Awaitable[object]]

#: What a provider's garbage raises inside an adapter (a stream line that is not JSON,
#: content that is not a list of blocks…): a failure a ``Retry`` can classify.
GARBAGE = (ValueError, TypeError, AttributeError, LookupError)


def error_message(error: BaseException) -> str:
    """The provider's own message for a failed call, else the exception's text."""
    body = getattr(error, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return cut(inner["message"], 500).strip("'\"")
    return cut(str(error), 500).strip("'\"") or type(error).__name__


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the provider asked us to wait: ``retry-after-ms``, else ``retry-after``
    (seconds, or an HTTP date); ``None`` when it said nothing usable."""
    if headers is None:
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            parsed = email.utils.parsedate_tz(value)  # an HTTP date
            if parsed is None:
                continue
            seconds = email.utils.mktime_tz(parsed) - time.time()
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


def unreadable(error: BaseException) -> ModelError:
    """The ``MODEL_FAILED`` error for a reply the adapter could not read."""
    return ModelError(
        f"the provider's reply could not be read: {type(error).__name__}: "
        f"{cut(error_message(error), 300)}",
        MODEL_FAILED,
    )


def check_on_delta(on_delta: Any) -> None:
    if on_delta is not None and not callable(on_delta):
        raise TypeError(f"on_delta must be callable, got {cut(on_delta)}")


async def report_delta(on_delta: OnDelta | None, text: str | None) -> None:
    """Hand a piece of streamed text to ``on_delta`` (a plain or async callable)."""
    if text and on_delta is not None:
        reported = on_delta(text)
        if inspect.isawaitable(reported):
            await reported
