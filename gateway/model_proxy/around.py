"""What wraps each request the model proxy serves, beside the request itself: the
overhead header on every answer (``timed``), the request's SERVER span when the stack
traces (``request_span``), a refused key's decision lines (``RefusedKeys``), the record
of a request answered before anything went upstream (``finished_early``), what the
stack prices (``stack_prices``), the client keys as the gate asks them (``KeyRing``),
and the checks made at start (``check_fallbacks``)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio
from opentelemetry import trace

from guardstack.gateway.budgets import Budgets
from guardstack.gateway.model_proxy.gemini import GEMINI
from guardstack.gateway.model_proxy.replies import OVERHEAD_HEADER
from guardstack.gateway.model_proxy.responses import RESPONSES
from guardstack.gateway.model_proxy.routes import SELECTORS
from guardstack.gateway.model_proxy.upstream import DEFAULT, PROVIDER_NAMES, Target
from guardstack.gateway.model_proxy.wires import ANTHROPIC, OPENAI, Wire
from guardstack.gateway.request_log import Finished
from guardstack.pipeline import MODEL_FAILED, Harness, ModelError, ModelReply
from guardstack.pipeline.decisions import decided
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.validate import did_you_mean

if TYPE_CHECKING:
    from guardstack.gateway.model_proxy.exchange import Exchange
    from guardstack.gateway.model_proxy.request import ProxyRequest

__all__ = [
    "MAX_ADDRESSES",
    "KeyRing",
    "NoModel",
    "RefusedKeys",
    "RouteSpec",
    "Seen",
    "check_fallbacks",
    "finished_early",
    "request_span",
    "stack_prices",
    "timed",
    "tools_of",
    "wire_of",
]

#: How many client addresses the refused-key log remembers (the most recent).
MAX_ADDRESSES: Final = 10_000


def request_span(harness: Harness, wire: Wire, path: str) -> Any:
    """A SERVER span for a request, when the stack traces (its ``Tracing`` layer's
    tracer): what the guards decide about the request — a reminder, a stop, a budget's
    refusal — are events on it, and the model stage's spans its children. ``None``
    (nothing made) when nothing traces."""
    from guardstack.wrappers import Tracing

    tracer = next((h.plugin.tracer for h in harness.plugins if isinstance(h.plugin, Tracing)), None)
    if tracer is None:
        return None
    path = path.split("?", 1)[0]
    return tracer.start_span(
        f"POST {path}",
        kind=trace.SpanKind.SERVER,
        attributes={"http.request.method": "POST", "url.path": path,
                    "gen_ai.provider.name": PROVIDER_NAMES.get(wire.name, "_OTHER")},
    )  # fmt: skip


class RefusedKeys:
    """A refused key is a decision-log line — at most one a second per client address,
    so a client retrying a wrong key does not flood the log."""

    def __init__(self) -> None:
        self._logged: OrderedDict[str, float] = OrderedDict()

    def logged(self, request: Any, why: str) -> None:
        client = getattr(request, "client", None)
        address = str(getattr(client, "host", None) or "unknown")
        now = anyio.current_time()
        last = self._logged.get(address)
        if last is not None and now - last < 1.0:
            return
        self._logged[address] = now
        self._logged.move_to_end(address)
        while len(self._logged) > MAX_ADDRESSES:
            self._logged.popitem(last=False)
        decided("refuse", layer="gate", decision="unauthorized", reason=f"{why} ({address})")


class KeyRing(Mapping[str, str]):
    """Client key -> tenant, as the gate asks it: the tenants file's keys and the keys
    issued at ``/admin/keys``, live and not revoked."""

    def __init__(self, budgets: Budgets) -> None:
        self.budgets = budgets

    def __getitem__(self, key: str) -> str:
        entry = self.budgets.key(key)
        if entry is None:
            raise KeyError(key)
        return entry.tenant

    def __iter__(self) -> Iterator[str]:
        return iter(self.budgets.tenants.keys)

    def __len__(self) -> int:
        return len(self.budgets.tenants.keys) + len(self.budgets.issued)


def timed(app: Any) -> Any:
    """``app`` with ``x-guardstack-overhead-ms`` on every answer that does not carry it
    already (a path no route serves, a method no route takes): the whole of such an
    answer's time is the proxy's own."""

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()

        async def sending(message: Any) -> None:
            if message.get("type") == "http.response.start":
                headers = list(message.get("headers") or [])
                if not any(name.lower() == _OVERHEAD_BYTES for name, _ in headers):
                    spent = f"{(time.perf_counter() - started) * 1000:.2f}".encode()
                    message = {**message, "headers": [*headers, (_OVERHEAD_BYTES, spent)]}
            await send(message)

        await app(scope, receive, sending)

    return timed


_OVERHEAD_BYTES: Final = OVERHEAD_HEADER.encode()


def stack_prices(harness: Harness) -> dict[str, Any]:
    """What the stack's ``usage-limit`` layers price (their ``prices``), merged."""
    from guardstack.guards import UsageLimit

    found: dict[str, Any] = {}
    for handle in harness.plugins:
        plugin = handle.plugin
        if isinstance(plugin, UsageLimit) and plugin.prices:
            found.update(plugin.prices)
    return found


class Seen:
    """What one request became, as far as it went: its value, its exchange."""

    __slots__ = ("exchange", "request")

    def __init__(self) -> None:
        self.request: ProxyRequest | None = None
        self.exchange: Exchange | None = None


def finished_early(
    request: ProxyRequest | None, wire: Wire, status: int, stopped: str | None, started: float
) -> Finished:
    """A request answered before anything went upstream (a refusal, a stop; before its
    value was built, a gate's or a body's refusal: nobody known yet)."""
    elapsed = (time.perf_counter() - started) * 1000
    if request is not None:
        return request.finished(status, stopped, ms=elapsed, overhead_ms=elapsed)
    return Finished(None, None, None, None, None, SELECTORS[wire.name], None, False, status,
                    None, None, None, elapsed, elapsed, stopped)  # fmt: skip


class RouteSpec:
    """Where a request goes upstream, and what its path (not its body) says."""

    __slots__ = ("model", "path", "stream")

    def __init__(self, path: str, model: str | None, stream: bool | None) -> None:
        self.path, self.model, self.stream = path, model, stream


class NoModel:
    """The conversation agent's own model: never called (each request names the upstream)."""

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        raise ModelError("the proxy's agents have no model of their own", MODEL_FAILED)


def tools_of(data: Mapping[str, Any]) -> list[Any]:
    tools = data.get("tools")
    return tools if isinstance(tools, list) else []


def wire_of(request: Any) -> Wire:
    path = str(getattr(request, "url", "") and request.url.path)
    if path.startswith(ANTHROPIC.path):
        return ANTHROPIC
    if path.startswith("/v1beta/"):
        return GEMINI
    if path.startswith(RESPONSES.path):
        return RESPONSES
    return OPENAI


def check_fallbacks(harness: Harness, upstreams: Mapping[str, Target]) -> None:
    """Every ``Fallback(to={"upstream": NAME})`` in the stack names a known upstream."""
    from guardstack.wrappers import Fallback

    for handle in harness.plugins:
        plugin = handle.plugin
        for target in plugin.targets if isinstance(plugin, Fallback) else ():
            if not isinstance(target, Mapping):
                continue
            name = target["upstream"]
            if name not in upstreams:
                known = [n for n in upstreams if n != DEFAULT]
                raise ConfigError(
                    f"{handle.id}: `to.upstream` names {name!r}, which is not an upstream "
                    f"(--upstream NAME=URL gives: {', '.join(known) or 'none'})"
                    f"{did_you_mean(name, known)}",
                    plugin=handle.id,
                    key="to.upstream",
                    value=name,
                )
