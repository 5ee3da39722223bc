"""How the proxy answers when it answers itself: a guard's or a budget's stop as the
model's last words (or the API's error), and an error in the API's own shape — with the
headers that say so (``x-guardstack-stopped``, ``x-should-retry``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

from guardstack.gateway.model_proxy.wires import Wire

__all__ = ["NOT_RETRIED", "OVERHEAD_HEADER", "STOPPED_HEADER", "error_response", "stop_response"]

STOPPED_HEADER: Final = "x-guardstack-stopped"
OVERHEAD_HEADER: Final = "x-guardstack-overhead-ms"
#: Statuses a client's retry cannot help: they carry ``x-should-retry: false``.
NOT_RETRIED: Final = frozenset({400, 401, 403, 404, 413, 415})


def stop_response(
    wire: Wire,
    plugin: str,
    text: str,
    model: str,
    stream: bool,
    headers: Mapping[str, str],
    *,
    as_error: bool = False,
    structured: bool = False,
) -> Any:
    """The stop a guard asked for, as the assistant's reply (``finish_reason: stop`` /
    ``stop_reason: end_turn``…) — or, ``as_error`` (``--stop-as error``), as the API's
    own error: 429 for a budget or a limit, 400 otherwise — naming the plugin in
    ``x-guardstack-stopped``. A request that asked for structured output (JSON: a
    client's side call, Gemini CLI's model router) cannot take words for an answer — a
    client retries an answer that does not parse — so its stop is the API's 400, which
    no client retries."""
    from starlette.responses import JSONResponse, StreamingResponse

    content = f"Stopped by {plugin}: {text}" if not text.startswith("Stopped by ") else text
    headers = {**headers, STOPPED_HEADER: plugin}
    if structured and not as_error:
        return error_response(wire, 400, "stopped", content, {**headers, "x-should-retry": "false"})
    if as_error:
        limited = plugin == "budgets" or plugin.endswith("-limit")
        status, kind = (429, "rate_limit") if limited else (400, "stopped")
        return error_response(wire, status, kind, content, {**headers, "x-should-retry": "false"})
    if not stream:
        return JSONResponse(wire.stop_body(model, content), headers=headers)

    async def events() -> AsyncIterator[bytes]:
        for event, payload in wire.stop_events(model, content):
            named_event = f"event: {event}\n" if event else ""
            yield f"{named_event}data: {json.dumps(payload)}\n\n".encode()
        if wire.done_line():
            yield wire.done_line()

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def error_response(
    wire: Wire, status: int, kind: str, message: str, headers: Mapping[str, str] | None = None
) -> Any:
    """An error in the API's own shape (``x-should-retry: false`` where a retry cannot
    help, for the clients that honour it)."""
    from starlette.responses import JSONResponse

    extra = dict(headers or {})
    if status in NOT_RETRIED:
        extra.setdefault("x-should-retry", "false")
    return JSONResponse(wire.error_body(status, kind, message), status, headers=extra)
