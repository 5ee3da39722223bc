"""What every provider adapter needs the same way: error text, ``retry-after``, deltas,
and switching the model a copy asks for.

The official clients of OpenAI and Anthropic (and LiteLLM, which wraps them) share an
error-body shape (``{"error": {"message": …}}``) and the ``retry-after-ms`` /
``retry-after`` headers; the adapters read them here, and report streamed text to
``on_delta`` here, so each adapter keeps only its provider's own wire format.
"""

from __future__ import annotations

import copy
import email.utils
import inspect
import logging
import math
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Self

from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_OVERLOADED,
    MODEL_RATE_LIMITED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    ModelError,
    ModelReply,
    Usage,
)
from guardstack.pipeline.validate import cut

__all__ = [
    "GARBAGE",
    "OnDelta",
    "ProviderModel",
    "answer",
    "check_on_delta",
    "error_message",
    "report_delta",
    "retry_after_s",
    "status_error",
    "unreadable",
    "usage_reported",
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


def status_error(status: int, message: str, headers: Mapping[str, str] | None) -> ModelError:
    """The ``ModelError`` of an HTTP error status: 429 → ``MODEL_RATE_LIMITED`` and 529 →
    ``MODEL_OVERLOADED`` (each with the provider's wait), 408 → ``MODEL_TIMEOUT``, 5xx
    and 409 → ``MODEL_UNAVAILABLE``, any other → ``MODEL_REJECTED``."""
    described = f"HTTP {status}: {message}"
    if status == 429:
        return ModelError(described, MODEL_RATE_LIMITED, retry_after_s(headers))
    if status == 529:
        return ModelError(described, MODEL_OVERLOADED, retry_after_s(headers))
    if status == 408:
        return ModelError(described, MODEL_TIMEOUT)
    if status >= 500 or status == 409:
        return ModelError(described, MODEL_UNAVAILABLE, retry_after_s(headers))
    return ModelError(described, MODEL_REJECTED)


logger = logging.getLogger("guardstack")

#: No call reports more tokens than this: a larger count is garbage, not usage.
MOST_TOKENS = 10**10


def _count(value: object, required: bool) -> int | None:
    """A token count as reported: ``None`` (not a count) for anything but a whole
    number in ``[0, MOST_TOKENS]``; a missing optional count is 0."""
    if value is None and not required:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    if not 0 <= value <= MOST_TOKENS:
        return None
    return int(value)


def usage_reported(
    input_tokens: object,
    output_tokens: object,
    *,
    cached_input_tokens: object = None,
    reasoning_tokens: object = None,
    cache_write_tokens: object = None,
    source: str = "the provider",
) -> Usage | None:
    """A reply's usage as a provider reported it, or ``None`` — *unknown* usage, which a
    spend cap charges at its reservation — when a count is missing, negative, not a
    whole number, not finite or past any real call's (logged once per reply)."""
    counts = [
        _count(input_tokens, True),
        _count(output_tokens, True),
        _count(cached_input_tokens, False),
        _count(reasoning_tokens, False),
        _count(cache_write_tokens, False),
    ]
    if any(count is None for count in counts):
        logger.warning(
            "%s reported usage guardstack cannot count (input %s, output %s); it is "
            "charged as unknown (its reservation)",
            source,
            cut(input_tokens, 40),
            cut(output_tokens, 40),
        )
        return None
    plain, output, cached, reasoning, written = (int(count or 0) for count in counts)
    return Usage(plain, output, cached, reasoning, written)


def unreadable(error: BaseException) -> ModelError:
    """The ``MODEL_FAILED`` error for a reply the adapter could not read."""
    return ModelError(
        f"the provider's reply could not be read: {type(error).__name__}: "
        f"{cut(error_message(error), 300)}",
        MODEL_FAILED,
    )


async def answer(
    call: Callable[[], Awaitable[ModelReply]],
    provider_errors: type[BaseException],
    model_error: Callable[[BaseException], ModelError],
) -> ModelReply:
    """Make one provider call: its client's exceptions mapped by ``model_error``, garbage
    from the provider (a stream line that is not JSON, content that is not a list…) a
    ``MODEL_FAILED`` a ``Retry`` can classify, never a crash."""
    try:
        return await call()
    except ModelError:
        raise
    except provider_errors as error:
        raise model_error(error) from error
    except GARBAGE as error:
        raise unreadable(error) from error
    except Exception as error:
        if isinstance(error, _transport_errors()):  # a body cut off mid-read
            raise ModelError(
                f"the connection broke mid-reply: {type(error).__name__}: "
                f"{cut(error_message(error), 300)}",
                MODEL_UNAVAILABLE,
            ) from error
        raise


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP clients' transport errors (httpx's, and the ``httpx2`` some provider
    clients ship), of those already imported: what a provider's client lets through
    when a streamed body is cut off after its request succeeded."""
    found = []
    for name in ("httpx", "httpx2"):
        module = sys.modules.get(name)
        error = getattr(module, "TransportError", None)
        if isinstance(error, type) and issubclass(error, BaseException):
            found.append(error)
    return tuple(found)


def check_on_delta(on_delta: Any) -> None:
    if on_delta is not None and not callable(on_delta):
        raise TypeError(f"on_delta must be callable, got {cut(on_delta)}")


async def report_delta(on_delta: OnDelta | None, text: str | None) -> None:
    """Hand a piece of streamed text to ``on_delta`` (a plain or async callable)."""
    if text and on_delta is not None:
        reported = on_delta(text)
        if inspect.isawaitable(reported):
            await reported


class ProviderModel:
    """What the shipped adapters (OpenAI, Anthropic, LiteLLM) share as models:
    ``with_model`` (``SwitchableModel``) and ``reports_chunks`` (``StreamingModel``)."""

    model: str
    #: Streamed replies report each piece to ``on_chunk`` (a ``Timeout``'s
    #: ``first_byte_ms``/``idle_ms``); a reply that does not stream is one piece.
    reports_chunks = True

    def with_model(self, model: str) -> Self:
        """The same client and settings, asking for ``model`` (a ``UsageLimit``'s
        downgrade to a cheaper model)."""
        switched = copy.copy(self)
        switched.model = model
        return switched
