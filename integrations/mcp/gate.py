"""The proxy's HTTP front door: ``gated`` puts the ``Gate``'s checks before the SDK's
streamable-HTTP app, and cancels the calls of a client whose connection drops."""

from __future__ import annotations

import json
from typing import Any, Final

import anyio

from guardstack.integrations._gate import Gate, Refused

__all__ = [
    "checked_by_gate",
    "gated",
]


def checked_by_gate() -> Any:
    """The SDK's own Origin/Host checks are off: the gate makes them, on every address."""
    from mcp.server.transport_security import TransportSecuritySettings

    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


#: Where ``gated`` keeps, in a request's ASGI scope, the calls that request carries.
_CALLS: Final = "guardstack.mcp.calls"


def calls_of(ctx: Any) -> list[anyio.CancelScope] | None:
    """The calls of the HTTP request ``ctx`` came in (``None``: not through ``gated``)."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    calls = scope.get(_CALLS) if isinstance(scope, dict) else None
    return calls if isinstance(calls, list) else None


def gated(inner: Any, gate: Gate) -> Any:
    """The ASGI app ``inner`` behind ``gate``'s checks: a refusal is a JSON-RPC error
    with the gate's status, never a 500 — a 401 with ``WWW-Authenticate: Bearer
    error="invalid_token"`` (RFC 6750), so a client (the MCP Inspector) reports the
    gateway's message instead of starting an OAuth flow. Lifespan events pass straight through. A
    client whose connection drops before its answer was sent has the calls that
    request carries cancelled (downstream too: the SDK tells the server)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await inner(scope, receive, send)
            return
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", ())
        }
        method = str(scope.get("method", "GET")).upper()
        try:
            gate.check(headers, method)
        except Refused as refused:
            body = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": refused.message},
                }
            ).encode()
            answer = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            if refused.status == 401:  # RFC 6750: a bearer token, refused; not OAuth
                said = refused.message.replace("\\", "\\\\").replace('"', '\\"')
                challenge = f'Bearer error="invalid_token", error_description="{said}"'
                answer.append((b"www-authenticate", challenge.encode("latin-1", "replace")))
            await send({"type": "http.response.start", "status": refused.status, "headers": answer})
            await send({"type": "http.response.body", "body": body})
            return
        calls: list[anyio.CancelScope] = []
        scope[_CALLS] = calls
        answered = False

        async def watched_receive() -> Any:
            message = await receive()
            if message.get("type") == "http.disconnect" and not answered:
                for call in list(calls):
                    call.cancel()
            return message

        async def watched_send(message: Any) -> None:
            nonlocal answered
            if message.get("type") == "http.response.body" and not message.get("more_body"):
                answered = True
            await send(message)

        await inner(scope, watched_receive, watched_send)

    return app
