"""The admin routes both gateways serve: an operator's control over the network.

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

With budgets (a tenants file), more routes, each behind the same key and in the same
shape (``docs/team-budgets.md``):

* ``POST /admin/keys`` ``{tenant, team?, name?, expires?, budget?}`` -> ``{"id", "key"}``
  (the key shown once, stored as a digest); ``GET /admin/keys?tenant=T`` (never the
  keys); ``DELETE /admin/keys/{id}``;
* ``PUT /admin/budgets/{scope}`` with the budget mapping itself as the body (scope
  ``tenant:acme``, ``team:acme/ci``, ``key:TENANT/NAME``, ``defaults:key``,
  ``defaults:conversation``); ``GET`` it (the budget, its source and each window's
  limit, spent, reserved and remaining) or ``DELETE`` it (the file's applies again);
  ``GET /admin/budgets`` lists the operators' budgets; a scope naming nothing is 404;
* ``GET /admin/spend?scope=S&window=day|month&by=team|key|model|conversation``;
* ``GET /admin/decisions?since=TS``: the decision log's last lines.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from guardstack.integrations._gate import Gate, Refused, client_key
from guardstack.pipeline.contract import Control
from guardstack.pipeline.decisions import decided
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

    def __init__(
        self,
        control: Control,
        key: str,
        gate: Gate,
        *,
        budgets: Any = None,
        decisions: Any = None,
    ) -> None:
        if not isinstance(key, str) or len(key) < 16:
            raise ConfigError(
                "the admin key must be text of 16 characters or more (it guards every override)",
                key="admin_key",
            )
        self.control = control
        #: The scopes' budgets and keys (``integrations.budgets.Budgets``), if any.
        self.budgets = budgets
        #: The decision log's recent lines (``integrations.decisions.DecisionLog``).
        self.decisions = decisions
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
            path = str(scope.get("path", ""))
            if scope.get("type") == "http" and (path == PATH or path.startswith("/admin/")):
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
        path = str(scope.get("path", ""))
        query = _query(scope)
        try:
            status, answer = await self._answer(method, path, query, headers, receive)
        except Refused as refused:
            status, answer = refused.status, _error(refused.kind, refused.message)
        except ConfigError as mistake:
            status, answer = 400, _error("invalid_request", str(mistake))
        except Exception:  # a store that failed: the operator's error, never a traceback
            logger.warning("admin: a request failed", exc_info=True)
            status, answer = 503, _error("unavailable", "the store did not answer")
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
        self,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        receive: Receive,
    ) -> tuple[int, dict[str, Any]]:
        if method not in ("GET", "POST", "PUT", "DELETE"):
            return 405, _error("invalid_request", "GET, POST, PUT or DELETE")
        self.gate.check(headers, "POST" if method in ("POST", "PUT") else "GET")
        offered = client_key(headers)
        if not offered or not hmac.compare_digest(offered.encode(), self.key):
            raise Refused(401, "the admin key is needed", "authentication")
        if path != PATH:
            return await self._other(method, path, query, receive)
        if method not in ("GET", "POST"):
            return 405, _error("invalid_request", "GET or POST")
        if method == "POST":
            request = await _read_json(receive)
            await self._act(request)
        overrides = await self.control.overrides()
        return 200, {
            "overrides": [json.loads(override.to_json()) for override in overrides],
        }

    async def _other(
        self, method: str, path: str, query: dict[str, str], receive: Receive
    ) -> tuple[int, dict[str, Any]]:
        """The budget, key, spend and decision routes."""
        if path == "/admin/decisions" and method == "GET" and self.decisions is not None:
            since = _number(query.get("since"), "since")
            return 200, {"decisions": self.decisions.since(since)}
        budgets = self.budgets
        if budgets is None:
            return 404, _error("not_found", f"no admin route {path} here (no tenants file)")
        if path == "/admin/keys" and method == "POST":
            request = await _read_json(receive)
            if not isinstance(request, dict):
                raise ConfigError("the body must be a JSON object", key="body")
            issued = await budgets.issue(request)
            who = f"{request.get('tenant')}/{request.get('team') or '-'}"
            _acted("issue_key", f"key {issued.get('id')} for {who}")
            return 201, issued
        if path == "/admin/keys" and method == "GET":
            return 200, {"keys": budgets.listed(query.get("tenant"))}
        if path.startswith("/admin/keys/") and method == "DELETE":
            key_id = path.removeprefix("/admin/keys/")
            if not await budgets.revoke(key_id):
                return 404, _error("not_found", f"no key {key_id!r}")
            _acted("revoke_key", f"key {key_id}")
            return 200, {"id": key_id, "revoked": True}
        if path == "/admin/budgets" and method == "GET":
            return 200, budgets.overrides_listed()
        if path.startswith("/admin/budgets/"):
            # the server decoded the path once (``%2F`` is ``/``): never again
            scope = path.removeprefix("/admin/budgets/")
            try:
                if method == "GET":
                    return 200, await budgets.budget_view(scope)
                if method == "DELETE":
                    removed = await budgets.remove_budget(scope)
                    _acted("remove_budget", scope)
                    return 200, removed
                if method == "PUT":
                    request = await _read_json(receive)
                    changed = await budgets.set_budget(scope, request)
                    _acted("set_budget", f"{changed['scope']}: {json.dumps(changed['budget'])}")
                    return 200, changed
            except LookupError as unknown:
                return 404, _error("not_found", str(unknown).strip("'\""))
        if path == "/admin/spend" and method == "GET":
            try:
                report = await budgets.spend(
                    query.get("scope"), query.get("window", "day"), query.get("by")
                )
            except LookupError as unknown:
                return 404, _error("not_found", str(unknown).strip("'\""))
            return 200, report
        return 404, _error("not_found", f"no admin route {method} {path}")

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
        _acted(str(action), f"{action} by {by}", layer=layer, tool=tool)


def _acted(action: str, what: str, layer: str | None = None, tool: str | None = None) -> None:
    """One decision-log line for an operator's change."""
    decided("admin", layer=layer or "admin", decision=action, reason=what, tool=tool)


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


def _query(scope: Scope) -> dict[str, str]:
    from urllib.parse import parse_qsl

    raw = scope.get("query_string", b"")
    text = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
    return dict(parse_qsl(text))


def _number(value: str | None, name: str) -> float:
    if value is None:
        return 0.0
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number (seconds since the epoch)", key=name) from None


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}
