"""The admin route both proxies serve: an operator's manual control over the network.

``GET /admin/control`` lists the overrides in force; ``POST /admin/control`` makes one
— ``{"action": ACTION, "tool": …, "layer": …, "reason": …, "values": {…}, "by": …}``,
the actions being ``harness.control``'s methods: ``force_open``, ``isolate``,
``force_closed``, ``release``, ``pause``, ``resume``, ``set_limit``, ``clear_limit``.
The answer is the overrides in force after it.

It is a gateway route like any other: the ``Origin`` and ``Host`` checks and the body
bound of the service's ``Gate``; then the admin key (``Authorization: Bearer KEY``,
compared in constant time) — without it, 401 and nothing changes. A mistake (an
unknown action, breaker, tool or value) is 400 naming what exists, in this route's own
error shape ``{"error": {"type": …, "message": …}}``, never a 500. With no admin key
configured there is no admin route (404).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from guardstack.integrations._gate import Gate, Refused, client_key
from guardstack.pipeline.contract import Control
from guardstack.pipeline.errors import ConfigError

__all__ = ["PATH", "Admin"]

logger = logging.getLogger("guardstack")

PATH: Final = "/admin/control"
#: The largest admin request body read.
MAX_BODY_BYTES: Final = 64 * 1024
_ACTIONS: Final = {
    "force_open": ("tool",),
    "isolate": ("tool",),
    "force_closed": ("tool",),
    "release": ("tool",),
    "pause": ("tool",),
    "resume": ("tool",),
    "set_limit": ("layer",),
    "clear_limit": ("layer",),
}
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class Admin:
    """``control`` at ``PATH``, behind ``key`` and the checks of ``gate``."""

    def __init__(self, control: Control, key: str, gate: Gate) -> None:
        if not isinstance(key, str) or len(key) < 16:
            raise ConfigError(
                "the admin key must be text of 16 characters or more (it guards every override)",
                key="admin_key",
            )
        self.control = control
        self.key = key.encode()
        self.gate = Gate(
            listen_host=gate.listen_host,
            keys=None,
            allow_origins=gate.allow_origins,
            allow_hosts=gate.allow_hosts,
            max_body_bytes=MAX_BODY_BYTES,
        )

    def around(self, inner: App) -> App:
        """An ASGI app serving ``PATH`` and passing everything else to ``inner``."""

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope.get("type") == "http" and scope.get("path") == PATH:
                await self(scope, receive, send)
                return
            await inner(scope, receive, send)

        return app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", ())
        }
        method = str(scope.get("method", "GET")).upper()
        try:
            status, answer = await self._answer(method, headers, receive)
        except Refused as refused:
            status, answer = refused.status, _error(refused.kind, refused.message)
        except ConfigError as mistake:
            status, answer = 400, _error("invalid_request", str(mistake))
        except Exception:  # a store that failed: the operator's error, never a traceback
            logger.warning("admin: a control request failed", exc_info=True)
            status, answer = 503, _error("unavailable", "the control store did not answer")
        body = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _answer(
        self, method: str, headers: dict[str, str], receive: Receive
    ) -> tuple[int, dict[str, Any]]:
        if method not in ("GET", "POST"):
            return 405, _error("invalid_request", "GET or POST")
        self.gate.check(headers, method)
        offered = client_key(headers)
        if not offered or not hmac.compare_digest(offered.encode(), self.key):
            raise Refused(401, "the admin key is needed", "authentication")
        if method == "POST":
            request = await _read_json(receive)
            await self._act(request)
        overrides = await self.control.overrides()
        return 200, {
            "overrides": [json.loads(override.to_json()) for override in overrides],
        }

    async def _act(self, request: object) -> None:
        if not isinstance(request, dict):
            raise ConfigError("the body must be a JSON object with an action", key="body")
        action = request.get("action")
        if action not in _ACTIONS:
            raise ConfigError(
                f"unknown action {action!r}; one of {', '.join(_ACTIONS)}", key="action"
            )
        for needed in _ACTIONS[action]:
            if not isinstance(request.get(needed), str) or not request[needed]:
                raise ConfigError(f"{action} needs {needed!r} (text)", key=needed)
        by = request.get("by", "admin")
        by = by if isinstance(by, str) else "admin"
        tool, layer = request.get("tool"), request.get("layer")
        if tool is not None and not isinstance(tool, str):
            raise ConfigError("'tool' must be text", key="tool")
        if layer is not None and not isinstance(layer, str):
            raise ConfigError("'layer' must be text", key="layer")
        control = self.control
        if action == "pause":
            await control.pause(str(tool), reason=str(request.get("reason") or ""), by=by)
        elif action == "resume":
            await control.resume(str(tool), by=by)
        elif action == "set_limit":
            values = request.get("values")
            if not isinstance(values, dict):
                raise ConfigError("set_limit needs 'values': {name: number}", key="values")
            await control.set_limit(str(layer), tool=tool, by=by, **values)
        elif action == "clear_limit":
            await control.clear_limit(str(layer), tool=tool, by=by)
        else:
            await getattr(control, action)(str(tool), layer=layer, by=by)


async def _read_json(receive: Receive) -> object:
    body = b""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            raise Refused(400, "the request ended before its body", "invalid_request")
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            raise Refused(413, "the body is too large", "too_large")
        if not message.get("more_body"):
            break
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise Refused(400, "the body is not JSON", "invalid_request") from None


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}
