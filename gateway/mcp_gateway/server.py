"""The gateway: several downstream MCP servers behind one guarded front door.

Its clients see one MCP server. Each downstream's tools, prompts and resources are served
as ``<server>_<name>``. Each tool call goes through the guard stack (the harness) and
the caller's tenant's quotas. A tenant (``--keys``) sees only the servers and tools it is
given: what it may not see is neither listed nor callable (a call to it gets the same
answer as a call to a tool that does not exist).

Over streamable HTTP every request passes the gateway's ``Gate`` first: a known key
in ``Authorization`` (when keys are given), an ``Origin`` it allows, a ``Host`` that is
the listen address, ``localhost`` or loopback — on every listen address — and a bounded
body. Sessions are bounded too (``session_idle_s``, ``max_sessions``), and a client that
goes away has its calls cancelled downstream.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from typing import TYPE_CHECKING, Any, Final, TextIO

import anyio
from anyio.abc import TaskStatus

from guardstack.gateway.mcp_gateway.config import SEPARATOR, GatewayConfig, Keys, Tenant
from guardstack.gateway.mcp_gateway.downstream import RESTARTING, Downstream
from guardstack.integrations._extras import require
from guardstack.integrations._gate import Gate, client_key
from guardstack.integrations.mcp import (
    EXTRA,
    NotificationRelay,
    checked_by_gate,
    client_tracer,
    gated,
    serve_call,
    tracing_provider,
    with_note_field,
)
from guardstack.pipeline.contract import Window, new_token, store_key
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.ledger import CALENDAR_GRACE_S, Ledger, calendar_window
from guardstack.pipeline.values import (
    TOOL_ABORTED_BEFORE_DISPATCH,
    TOOL_DENIED,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    TOOL_REJECTED,
    ToolCall,
    ToolResult,
)

if TYPE_CHECKING:
    from mcp.types import CallToolResult

__all__ = ["Gateway"]

logger = logging.getLogger("guardstack")

PLUGIN: Final = "mcp-gateway"
#: The header a client names its conversation by (as the model proxy reads it).
CONVERSATION_HEADER: Final = "x-guardstack-conversation"
#: How long ``run`` waits for every downstream's first start before serving anyway.
FIRST_START_S: Final = 30.0
#: Result codes of a call that never reached its tool: its quota is given back.
_NOT_REACHED: Final = frozenset(
    {TOOL_DENIED, TOOL_ABORTED_BEFORE_DISPATCH, TOOL_OVERLOADED, TOOL_RATE_LIMITED, TOOL_REJECTED}
)


class Gateway:
    """The gateway's downstreams, its harness, its tenants, and the MCP server it serves.

    ``run()`` keeps the downstreams running (start it in a task group first);
    ``server()`` is the MCP server clients talk to (``serve_stdio``, or ``http_app``
    behind a ``Gate``)."""

    def __init__(
        self,
        harness: Harness,
        config: GatewayConfig,
        *,
        keys: Keys | None = None,
        ping_s: float = 5.0,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        errlog: TextIO | None = None,
    ) -> None:
        require("mcp", EXTRA)
        quotas = keys is not None and any(t.quotas for t in keys.tenants.values())
        if quotas and not isinstance(harness.store, Ledger):
            raise ConfigError(
                f"{config.source}: quotas are counted in a ledger; the harness's store "
                f"{type(harness.store).__name__} is not one (use MemoryStore or RedisStore)",
                key="quotas",
            )
        self.harness = harness
        self.config = config
        self.keys = keys
        #: Each client connection's conversation (its calls' key in the guard stack).
        self.conversations: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        #: Tells the clients the gateway's lists changed (a downstream restarted, or
        #: listed again); downstream logs are not relayed (they may name other tenants).
        self.relay = NotificationRelay()
        self.downstreams = {
            spec.name: Downstream(
                spec,
                harness,
                on_change=self.relay,
                ping_s=ping_s,
                first_backoff_s=first_backoff_s,
                max_backoff_s=max_backoff_s,
                errlog=errlog,
            )
            for spec in config.servers
        }
        self._calls = itertools.count(1)
        self._ids = itertools.count(1)
        self._tracer = client_tracer(tracing_provider(harness))

    # -- running ------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep every downstream running until cancelled; ``started`` once each has been
        tried (up, or down and waiting to start again), at most ``FIRST_START_S``."""
        async with anyio.create_task_group() as group:
            for downstream in self.downstreams.values():
                group.start_soon(downstream.run)
            with anyio.move_on_after(FIRST_START_S):
                for downstream in self.downstreams.values():
                    await downstream.wait_tried()
            task_status.started()

    def describe(self) -> str:
        """Every downstream, its state and its tools, the tenants, then the guard stack."""
        return self.describe_servers() + "\n" + self.harness.describe()

    def describe_servers(self) -> str:
        """Every downstream, its state and its tools, and the tenants."""
        lines = ["servers:"]
        for downstream in self.downstreams.values():
            lines.append(f"  {downstream.describe()}")
            lines.extend(f"    {downstream.served(name)}" for name in sorted(downstream.tools))
        if self.keys is not None:
            lines.append("tenants:")
            for tenant in self.keys.tenants.values():
                seen = ", ".join(
                    server if tools is None else f"{server} ({', '.join(sorted(tools))})"
                    for server, tools in tenant.servers.items()
                )
                quotas = "; ".join(quota.describe() for quota in tenant.quotas)
                lines.append(f"  {tenant.name}: {seen}" + (f"; quotas {quotas}" if quotas else ""))
        return "\n".join(lines)

    # -- who is asking ------------------------------------------------------------------

    def tenant(self, ctx: Any) -> Tenant | None:
        """The tenant a request comes from (``None``: no keys, every server is seen)."""
        if self.keys is None:
            return None
        return self.keys.tenant_of(client_key(_headers(ctx)))

    def sees(self, tenant: Tenant | None, server: str, name: str | None = None) -> bool:
        """Whether ``tenant`` may see ``server`` (and its tool ``name``)."""
        if self.keys is None:
            return True
        return tenant is not None and tenant.sees(server, name)

    def split(self, served: str) -> tuple[Downstream, str] | None:
        """The downstream and its own name for a served name, or ``None``."""
        server, separator, _ = served.partition(SEPARATOR)
        downstream = self.downstreams.get(server)
        if not separator or downstream is None:
            return None
        name = downstream.own(served)
        return (downstream, name) if name is not None else None

    def key_id(self, ctx: Any) -> str | None:
        """The id of the key a request came with (``None``: no keys, or none given)."""
        if self.keys is None:
            return None
        return self.keys.id_of(client_key(_headers(ctx)))

    def _conversation(self, ctx: Any, tenant: Tenant | None) -> str:
        """The conversation a request belongs to. Over HTTP nothing keys on a transport
        session (a 2026-07-28 client has none, and a new connection each request): it is
        the tenant's, the key's, and the ``x-guardstack-conversation`` header's, else the
        key's own. Over stdio, the one client's connection."""
        connection = getattr(ctx, "connection", None) or getattr(
            ctx.session, "_connection", ctx.session
        )
        self.relay.connections.add(connection)  # it hears of list changes from now
        who = tenant.name if tenant is not None else "any"
        request = getattr(ctx, "request", None)
        if request is not None:  # tenant, key and name as escaped parts: none spells another
            named = _headers(ctx).get(CONVERSATION_HEADER) or "-"
            return store_key("mcp-gateway", who, self.key_id(ctx) or "-", named)
        known = self.conversations.get(connection)
        if known is None:
            known = self.conversations[connection] = store_key(
                "mcp-gateway", who, str(next(self._ids))
            )
        return known

    # -- the MCP server -----------------------------------------------------------------

    def server(self) -> Any:
        """The SDK's low-level ``Server``, with every handler the gateway answers."""
        from mcp.server.lowlevel import NotificationOptions, Server
        from mcp.server.subscriptions import ListenHandler
        from mcp.types import (
            ListPromptsResult,
            ListResourcesResult,
            ListResourceTemplatesResult,
            ListToolsResult,
        )

        gateway = self

        def served(tenant: Tenant | None, kind: str) -> list[Any]:
            return [
                item.model_copy(update={"name": downstream.served(item.name)})
                for downstream in gateway.downstreams.values()
                if gateway.sees(tenant, downstream.name)
                for item in getattr(downstream, kind)
            ]

        async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
            tenant = gateway.tenant(ctx)
            gateway._conversation(ctx, tenant)  # it hears of tool-list changes from now
            tools = [
                with_note_field(tool).model_copy(update={"name": downstream.served(name)})
                for downstream in gateway.downstreams.values()
                for name, tool in downstream.tools.items()
                if gateway.sees(tenant, downstream.name, name)
            ]
            return ListToolsResult(tools=tools)

        async def call_tool(ctx: Any, params: Any) -> CallToolResult:
            tenant = gateway.tenant(ctx)
            found = gateway.split(params.name)
            if found is None or not gateway.sees(tenant, found[0].name, found[1]):
                return _error(f"no tool named {params.name!r}")
            downstream, name = found
            op_id: str | None = None
            conversation = gateway._conversation(ctx, tenant)
            if tenant is not None:
                whose = {"tenant": (tenant.name,), "conversation": (conversation,),
                         "key": (tenant.name, gateway.key_id(ctx) or "-")}  # fmt: skip
                refused, op_id = await gateway._reserve(tenant, downstream.name, name, whose)
                if refused is not None:
                    return _error(refused)
            call = ToolCall(
                params.name,
                params.arguments or {},
                f"gw_{next(gateway._calls)}",
                conversation=conversation,
                tenant=tenant.name if tenant is not None else None,
            )
            try:
                answer, result = await serve_call(gateway.harness, ctx, call, gateway._tracer)
            except BaseException:
                if op_id is not None:
                    with anyio.CancelScope(shield=True):
                        await gateway._settle(op_id, None)
                raise
            if op_id is not None:
                await gateway._settle(op_id, result)
            return answer

        async def list_prompts(ctx: Any, params: Any) -> ListPromptsResult:
            return ListPromptsResult(prompts=served(gateway.tenant(ctx), "prompts"))

        async def get_prompt(ctx: Any, params: Any) -> Any:
            found = gateway.split(params.name)
            if found is None or not gateway.sees(gateway.tenant(ctx), found[0].name):
                raise _invalid(f"no prompt named {params.name!r}")
            downstream, name = found
            return await _session(downstream).get_prompt(name, params.arguments)

        async def list_resources(ctx: Any, params: Any) -> ListResourcesResult:
            return ListResourcesResult(resources=served(gateway.tenant(ctx), "resources"))

        async def list_templates(ctx: Any, params: Any) -> ListResourceTemplatesResult:
            templates = served(gateway.tenant(ctx), "templates")
            return ListResourceTemplatesResult(resource_templates=templates)

        async def read_resource(ctx: Any, params: Any) -> Any:
            uri = str(params.uri)
            tenant = gateway.tenant(ctx)
            for downstream in gateway.downstreams.values():
                if gateway.sees(tenant, downstream.name) and downstream.offers(uri):
                    return await _session(downstream).read_resource(uri)
            raise _invalid(f"no resource {uri!r}")

        server = Server(
            "guardstack-mcp-gateway",
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_prompts=list_prompts,
            on_get_prompt=get_prompt,
            on_list_resources=list_resources,
            on_list_resource_templates=list_templates,
            on_read_resource=read_resource,
            on_subscriptions_listen=ListenHandler(self.relay.bus),
        )
        default_options = server.create_initialization_options

        def create_initialization_options(
            notification_options: Any = None, *args: Any, **kwargs: Any
        ) -> Any:
            # downstreams restart and change: the gateway announces its tool list changes
            changes = notification_options or NotificationOptions(
                tools_changed=True, prompts_changed=True, resources_changed=True
            )
            return default_options(changes, *args, **kwargs)

        server.create_initialization_options = create_initialization_options  # type: ignore[method-assign]
        return server

    async def serve_stdio(self, read_stream: Any, write_stream: Any) -> None:
        """Serve one client over a stdio connection's streams until it closes them."""
        server = self.server()
        await server.run(read_stream, write_stream, server.create_initialization_options())

    # -- quotas -------------------------------------------------------------------------

    async def _reserve(
        self, tenant: Tenant, server: str, tool: str, whose: dict[str, tuple[str, ...]]
    ) -> tuple[str | None, str | None]:
        """Reserve one call in every quota of ``tenant`` it counts in — each in the
        window of its own ``per`` (``whose``: the parts each is counted by) — the
        refusal's text (or ``None``), and the reservation's id (``None``: no quota)."""
        quotas = [q for q in tenant.quotas if q.server == server and q.tool in (None, tool)]
        if not quotas:
            return None, None
        ledger: Any = self.harness.store
        clock = getattr(ledger, "wall_clock", None)
        now = float(clock()) if callable(clock) else _now()
        windows = []
        for quota in quotas:
            period, _, end = calendar_window(now, quota.window)
            windows.append(
                Window(
                    store_key(PLUGIN, "quota", quota.per, *whose[quota.per], quota.server,
                              quota.tool or "*", period),
                    "calls",
                    quota.calls,
                    end - now + CALENDAR_GRACE_S,
                )
            )  # fmt: skip
        op_id = store_key(PLUGIN, "op", new_token())
        try:
            reservation = await ledger.reserve(op_id, {"calls": 1.0}, windows)
        except Exception as error:  # a quota is a cap: it fails closed
            logger.warning("mcp gateway: the quota store is not answering (%s)", error)
            return "the gateway cannot count this tenant's quota now; try again shortly", None
        if reservation.granted:
            return None, op_id
        refused = quotas[windows.index(reservation.window)] if reservation.window else quotas[0]
        served = self.downstreams[server].served if server in self.downstreams else None
        what = (
            f"tool {served(refused.tool) if served else refused.tool}"
            if refused.tool
            else f"server {server!r}"
        )
        whom = {"tenant": f"tenant {tenant.name!r}", "key": "this key",
                "conversation": "this conversation"}[refused.per]  # fmt: skip
        when, again = {
            "day": ("today", "at 00:00 UTC"),
            "hour": ("this hour", "on the hour"),
            "minute": ("this minute", "on the minute"),
        }[refused.window]
        return (
            f"{whom} has used its {refused.calls} calls {when} to {what} "
            f"(the quota starts again {again})",
            None,
        )

    async def _settle(self, op_id: str, result: ToolResult | None) -> None:
        """A call that never reached its tool gives its quota back; any other counts."""
        ledger: Any = self.harness.store
        reached = result is None or not (
            result.error is not None
            and (result.error.code in _NOT_REACHED or result.error.name == RESTARTING)
        )
        try:
            if reached:
                await ledger.settle(op_id, {"calls": 1.0})
            else:
                await ledger.release(op_id)
        except Exception:  # unsettled, it stays counted: the safe side
            logger.debug("mcp gateway: a quota reservation was not settled", exc_info=True)

    # -- HTTP ---------------------------------------------------------------------------

    def http_app(
        self,
        gate: Gate,
        *,
        session_idle_s: float = 600.0,
        max_sessions: int = 500,
    ) -> Any:
        """The gateway over streamable HTTP at ``/mcp``, behind ``gate`` (``gate.keys``:
        each key's tenant, as ``keys`` maps them)."""
        server = self.server()
        inner = server.streamable_http_app(
            host=gate.listen_host,
            session_idle_timeout=session_idle_s,
            max_sessions=max_sessions,
            max_request_body_size=gate.max_body_bytes,
            transport_security=checked_by_gate(),
        )
        return gated(inner, gate)


def _headers(ctx: Any) -> dict[str, str]:
    """A request's HTTP headers, lower-cased (none over stdio)."""
    headers = getattr(getattr(ctx, "request", None), "headers", None) or {}
    return {name.lower(): value for name, value in headers.items()}


def _now() -> float:
    import time

    return time.time()


def _session(downstream: Downstream) -> Any:
    if downstream.session is None:
        raise _invalid(f"the MCP server {downstream.name!r} is being started again")
    return downstream.session


def _error(text: str) -> CallToolResult:
    from mcp.types import CallToolResult, TextContent

    return CallToolResult(content=[TextContent(type="text", text=f"Error: {text}")], is_error=True)


def _invalid(text: str) -> Exception:
    from mcp.shared.exceptions import MCPError
    from mcp.types import INVALID_PARAMS

    return MCPError(INVALID_PARAMS, text)
