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
        if method == "POST" and ("mcp-method" in headers or "mcp-name" in headers):
            # a gateway that routes or authorizes by these headers checks every request
            # that carries one against its body, whatever its protocol version
            whole = await _whole_body(receive, gate.max_body_bytes)
            if whole is None:  # too large, or the client is gone: never replayed cut short
                await _refuse(send, 413, -32600, "the body is too large")
                return
            wrong = _headers_disagree(headers, whole)
            if wrong is not None:
                await _refuse(send, 400, -32020, wrong)
                return
            receive = _replayed(whole, receive)
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


async def _refuse(send: Any, status: int, code: int, message: str) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _whole_body(receive: Any, most: int) -> bytes | None:
    """The request's whole body; ``None`` when it passes ``most`` bytes or the client
    left before sending it all."""
    body = b""
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return None
        body += bytes(message.get("body", b""))
        if len(body) > most:
            return None
        if not message.get("more_body"):
            return body


def _replayed(body: bytes, receive: Any) -> Any:
    """A ``receive`` that hands the body read already, then the connection's own."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _headers_disagree(headers: dict[str, str], body: bytes) -> str | None:
    """Why ``Mcp-Method`` or ``Mcp-Name`` disagrees with the JSON-RPC ``body``, or
    ``None``: the method must be the body's; the name, for a method that names one
    (``tools/call``, ``prompts/get``, ``resources/read``), the one it names."""
    from mcp.shared.inbound import NAME_BEARING_METHODS, decode_header_value

    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the SDK answers it in its own words
    if not isinstance(message, dict):
        return "Mcp-Method and Mcp-Name describe one request, not a batch"
    method = message.get("method")
    said_method = headers.get("mcp-method")
    if said_method is not None and said_method != method:
        return "the Mcp-Method header does not match the request body's method"
    if "mcp-name" in headers:
        key = NAME_BEARING_METHODS.get(str(method))
        params = message.get("params")
        named = params.get(key) if key is not None and isinstance(params, dict) else None
        if named is None or decode_header_value(headers["mcp-name"]) != named:
            return "the Mcp-Name header does not match the request body's name"
    return None
