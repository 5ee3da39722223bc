"""MCP tools through the guard stack, and a guard proxy in front of any MCP server.

``mcp_tools(session)`` turns every tool an MCP server offers (through an official
SDK ``ClientSession``) into a ``ToolDefinition``::

    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for tool in await mcp_tools(session, timeouts_ms={"search_*": 5_000}):
            harness.tools.register(tool)

* name, description and input schema are the server's;
* budgets come from ``timeouts_ms`` (``*``-wildcard name patterns, first match
  wins) or ``default_timeout_ms``; a tool with neither has none, as everywhere;
* ``readOnlyHint`` or ``idempotentHint: true`` make a tool ``idempotent=True``,
  ``idempotentHint: false`` makes it ``idempotent=False`` (a ``Retry`` never runs it
  twice); without annotations it is undeclared; an explicit ``destructiveHint: true``
  (without ``readOnlyHint``) makes it ``destructive=True``, which ``Approval`` asks about;
* a guardstack timeout cancels the MCP request, and the SDK tells the server
  (``notifications/cancelled``), so the server stops the work too;
* an MCP error result (``isError``) becomes ``TOOL_FAILED`` with the server's text;
  text content is the result's text, other content is described (``[image
  image/png, 1,204 bytes]``), and structured content alone is rendered as JSON;
  the server's own ``CallToolResult`` is kept as the result's ``value``.

``serve_proxy`` is the ``guardstack mcp-proxy`` command's engine: an MCP server
that offers the downstream server's tools unchanged and runs every call through
the harness — timeouts, retries, caps, the reminder (appended to the result, as a
proxy cannot add messages), tracing. One client connection is one conversation
and one turn.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import itertools
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from guardstack.integrations._extras import require
from guardstack.integrations._framework import budgets
from guardstack.integrations._gate import Gate, Refused
from guardstack.pipeline import (
    Approve,
    Edit,
    GuardstackError,
    Harness,
    PendingApproval,
    Reject,
    ToolCall,
    ToolDefinition,
    ToolResult,
)
from guardstack.pipeline.approval import Decision
from guardstack.pipeline.validate import cut
from guardstack.pipeline.values import (
    TOOL_ABORTED,
    TOOL_UNAVAILABLE,
    failed_result,
    validate_timeout_ms,
)
from guardstack.wrappers._otel import VERSION, check_provider, end_span, start_span

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult, Tool

__all__ = [
    "MAX_PAGES",
    "McpServerError",
    "NotificationRelay",
    "checked_by_gate",
    "client_tracer",
    "gated",
    "mcp_tools",
    "proxy_server",
    "render_content",
    "serve_call",
    "serve_proxy",
    "serve_proxy_http",
    "sync_tools",
    "tracing_provider",
]

EXTRA = "mcp"
logger = logging.getLogger("guardstack")
OWNER = "mcp_tools"


#: A server still paging its tools/list after this many pages is refused (a cursor loop).
MAX_PAGES: Final = 1_000


class McpServerError(GuardstackError, RuntimeError):
    """An MCP server answered in a way guardstack cannot use (a tools/list that never ends,
    two tools under one name)."""


async def mcp_tools(
    session: ClientSession,
    *,
    timeouts_ms: Mapping[str, int] | None = None,
    default_timeout_ms: int | None = None,
    tracer_provider: Any = None,
) -> list[ToolDefinition]:
    """A ``ToolDefinition`` for every tool the session's server lists (all pages).

    ``tracer_provider``: the one ``Tracing`` reports to, when it is not the global one.
    The MCP SDK makes its own client span for each request, through the global
    provider, and carries that span's context in the request's ``_meta``; with another
    provider here, each call gets a ``tools/call {tool}`` client span in it too (the
    MCP conventions' attributes), whose context is what ``_meta`` carries when the
    global provider is the API's no-op — so the server's spans join the caller's trace.
    """
    require("mcp", EXTRA)
    from mcp.types import PaginatedRequestParams

    tool_budgets = budgets(OWNER, timeouts_ms)
    if default_timeout_ms is not None:
        validate_timeout_ms(OWNER, "default_timeout_ms", default_timeout_ms)
    listed: list[Tool] = []
    cursor: str | None = None
    seen_cursors: set[str] = set()
    for _ in range(MAX_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = await session.list_tools(params=params)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
        if cursor in seen_cursors:
            raise McpServerError(
                f"the MCP server's tools/list repeats the cursor {cut(cursor)}: it would never end"
            )
        seen_cursors.add(cursor)
    else:
        raise McpServerError(
            f"the MCP server's tools/list is still paging after {MAX_PAGES} pages "
            f"({len(listed)} tools); refused"
        )
    names = [tool.name for tool in listed]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise McpServerError(
            f"the MCP server lists tools under the same name twice: {', '.join(duplicates)}"
        )
    definitions = []
    for tool in listed:
        budget = next(
            (ms for pattern, ms in tool_budgets if pattern.fullmatch(tool.name)), default_timeout_ms
        )
        definitions.append(
            ToolDefinition(
                tool.name,
                _caller(session, tool.name, client_tracer(tracer_provider)),
                tool.description or "",
                dict(tool.input_schema),
                budget,
                _idempotent(tool),
                destructive=_destructive(tool),
            )
        )
    return definitions


_FLAT = (str, bool, int, float)


async def _ask_client(ctx: Any, pending: PendingApproval) -> Decision:
    """A person's decision on ``pending``, asked through MCP elicitation (form mode)."""
    from mcp.types import ClientCapabilities, ElicitationCapability

    session = ctx.session
    if not session.check_client_capability(ClientCapabilities(elicitation=ElicitationCapability())):
        return Reject(
            f'tool "{pending.tool}" needs a person\'s approval, and this MCP client cannot '
            "ask for it (it does not support elicitation)",
            by="mcp-proxy",
        )
    arguments = dict(pending.arguments)
    flat = all(isinstance(value, _FLAT) for value in arguments.values())
    choices = ["approve", "reject", "edit"] if flat else ["approve", "reject"]
    properties: dict[str, Any] = {
        "decision": {"type": "string", "enum": choices, "title": "Run this call?"},
        "reason": {"type": "string", "title": "Why (if you reject it)"},
    }
    if flat:
        for name, value in arguments.items():
            kind = (
                "boolean"
                if isinstance(value, bool)
                else "integer"
                if isinstance(value, int)
                else "number"
                if isinstance(value, float)
                else "string"
            )
            properties[f"edit.{name}"] = {"type": kind, "title": name, "default": value}
    shown = json.dumps(arguments, ensure_ascii=False)
    why = f" ({pending.reason})" if pending.reason else ""
    try:
        answer = await session.elicit_form(
            f'Allow tool "{pending.tool}" with arguments {shown}?{why}',
            {"type": "object", "properties": properties, "required": ["decision"]},
            related_request_id=ctx.request_id,
        )
    except Exception as error:  # the client failed to answer: nobody said yes
        return Reject(f"asking the MCP client failed ({type(error).__name__})", by="mcp-proxy")
    content = answer.content or {}
    if answer.action != "accept":
        return Reject(f"the person chose {answer.action}", by="mcp-client")
    choice = content.get("decision")
    if choice == "approve":
        return Approve(by="mcp-client", digest=pending.digest)
    if choice == "edit" and flat:
        edited = {name: content.get(f"edit.{name}", value) for name, value in arguments.items()}
        return Edit(edited, by="mcp-client")
    reason = content.get("reason") if isinstance(content.get("reason"), str) else None
    return Reject(reason or "the person said no", by="mcp-client")


def _destructive(tool: Tool) -> bool | None:
    """Only an explicit ``destructiveHint: true`` on a tool not marked read-only is
    destructive (an unannotated tool is not assumed to be); read-only is ``False``."""
    hints = tool.annotations
    if hints is None:
        return None
    if hints.read_only_hint:
        return False
    return True if hints.destructive_hint is True else None


def _idempotent(tool: Tool) -> bool | None:
    hints = tool.annotations
    if hints is None:
        return None
    if hints.read_only_hint:
        return True
    return hints.idempotent_hint


#: The error name of a call whose server went away mid-call (or before it).
SERVER_GONE: Final = "McpServerGone"

#: While the proxy runs a client's call: where that client wants progress sent — its
#: session, its progress token, its request id — so the downstream's progress reaches it.
_PROGRESS: contextvars.ContextVar[tuple[Any, str | int, Any] | None] = contextvars.ContextVar(
    "guardstack_mcp_progress", default=None
)


def _forward_progress(call: ToolCall) -> Any:
    """A ``progress_callback`` that tells the call (a ``Timeout(idle_ms=…)`` then bounds
    the gaps between the server's reports) and relays the downstream's progress to the
    proxy's client; ``None`` when nobody listens (the server is then asked for none)."""
    wanted = _PROGRESS.get()
    if wanted is None and call.on_progress is None:
        return None

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        call.progress()
        if wanted is None:
            return
        session, token, request_id = wanted
        try:
            await session.send_progress_notification(
                token, progress, total, message, related_request_id=request_id
            )
        except Exception:  # a client that left: its progress goes nowhere
            logger.debug("mcp-proxy: progress not relayed", exc_info=True)

    return relay


def client_tracer(provider: Any) -> Any:
    """A tracer for guardstack's own MCP client spans, or ``None`` when the SDK's spans
    already land in ``provider`` (it is the global one, or none was given)."""
    if check_provider(OWNER, "tracer_provider", provider, "get_tracer") is None:
        return None
    if provider is trace.get_tracer_provider():
        return None
    return provider.get_tracer("guardstack.mcp", VERSION)


def _caller(session: ClientSession, name: str, tracer: Any = None) -> Any:
    from mcp.shared.exceptions import MCPError
    from mcp.types import CONNECTION_CLOSED

    async def call_tool(arguments: Mapping[str, Any], call: ToolCall) -> ToolResult:
        # Cancelling this await (a guardstack timeout) makes the SDK send the server
        # notifications/cancelled for the request.
        span = token = None
        if tracer is not None:
            span = start_span(
                tracer,
                f"tools/call {name}",
                kind=SpanKind.CLIENT,
                attributes={
                    "mcp.method.name": "tools/call",
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.call.id": call.call_id,
                    **_session_attributes(session),
                },
            )
            token = otel_context.attach(trace.set_span_in_context(span))
        try:
            result = await session.call_tool(
                name, dict(arguments), progress_callback=_forward_progress(call)
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            _span_failed(span, "connection_closed")
            return _gone(name)
        except MCPError as error:
            _span_failed(span, str(error.error.code))
            if error.error.code == CONNECTION_CLOSED:
                return _gone(name)
            raise
        except BaseException as error:
            _span_failed(span, type(error).__qualname__)
            raise
        else:
            if result.is_error:
                _span_failed(span, "tool_error")
        finally:
            if token is not None:
                otel_context.detach(token)
            if span is not None:
                end_span(span)
        return _result_of(result)

    call_tool.__name__ = f"mcp_{name}"
    return call_tool


def _session_attributes(session: Any) -> dict[str, str]:
    attributes = {}
    version = getattr(session, "protocol_version", None)
    if isinstance(version, str):
        attributes["mcp.protocol.version"] = version
    return attributes


def _span_failed(span: Any, error_type: str) -> None:
    if span is not None and span.is_recording():
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR))


def _gone(name: str) -> ToolResult:
    return ToolResult.failure(
        f"the MCP server behind tool {name!r} stopped (its connection closed); the call "
        "did not complete",
        name=SERVER_GONE,
        code=TOOL_UNAVAILABLE,
    )


def _result_of(result: CallToolResult) -> ToolResult:
    """The guardstack result an MCP ``CallToolResult`` means (the original kept as ``value``)."""
    text = render_content(result)
    if result.is_error:
        failure = failed_result(text or "the MCP tool reported an error", "MCPToolError")
        return ToolResult(failure.content, True, failure.error, result)
    return ToolResult(text, value=result)


def render_content(result: CallToolResult) -> str:
    """The model-facing text of an MCP tool result."""
    parts = [_describe(block) for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _size(data: str) -> str:
    try:
        return f"{len(base64.b64decode(data, validate=False)):,} bytes"
    except (binascii.Error, ValueError):
        return "undecodable data"


def _describe(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind} {block.mime_type}, {_size(block.data)}]"
    if kind == "resource_link":
        return f"[resource {block.uri}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        mime = resource.mime_type or "application/octet-stream"
        return f"[resource {resource.uri}, {mime}, {_size(resource.blob)}]"
    return f"[{kind or 'unknown'} content]"


# -- the proxy ------------------------------------------------------------------------------

_connections = itertools.count(1)


class NotificationRelay:
    """What the downstream server says on its own, relayed to the proxy's clients: pass
    it as the downstream ``ClientSession``'s ``message_handler``.

    * a tool list change first brings the harness's tools up to date
      (``on_tools_changed``), then is relayed;
    * list changes and resource updates go to every client: on a 2026-07-28
      connection through its ``subscriptions/listen`` streams, on an older one as
      the notification itself;
    * a log message goes to the clients with a call in flight, on that call's
      stream (the downstream is one session for all clients, so a log cannot be
      told apart further), else to every older connection.
    """

    def __init__(self) -> None:
        from mcp.server.subscriptions import InMemorySubscriptionBus

        self.bus = InMemorySubscriptionBus()
        self.connections: weakref.WeakSet[Any] = weakref.WeakSet()
        #: The calls in flight: where a log message goes.
        self.calls: dict[int, tuple[Any, Any]] = {}
        self.on_tools_changed: Callable[[], Awaitable[None]] | None = None

    async def __call__(self, message: Any) -> None:
        if isinstance(message, Exception):
            return
        try:
            await self._relay(message)
        except Exception:  # a client that left, a refresh that failed: the proxy goes on
            logger.warning("mcp-proxy: a downstream notification was not relayed", exc_info=True)

    async def _relay(self, message: Any) -> None:
        from mcp import types
        from mcp.server.subscriptions import (
            PromptsListChanged,
            ResourcesListChanged,
            ResourceUpdated,
            ToolsListChanged,
        )

        event: Any
        legacy: tuple[str, tuple[str, ...]]
        if isinstance(message, types.LoggingMessageNotification):
            await self._log(message.params)
            return
        if isinstance(message, types.ToolListChangedNotification):
            if self.on_tools_changed is not None:
                await self.on_tools_changed()
            event, legacy = ToolsListChanged(), ("send_tool_list_changed", ())
        elif isinstance(message, types.PromptListChangedNotification):
            event, legacy = PromptsListChanged(), ("send_prompt_list_changed", ())
        elif isinstance(message, types.ResourceListChangedNotification):
            event, legacy = ResourcesListChanged(), ("send_resource_list_changed", ())
        elif isinstance(message, types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            event, legacy = ResourceUpdated(uri), ("send_resource_updated", (uri,))
        else:
            return
        await self.bus.publish(event)
        for connection in self._older():
            await getattr(connection, legacy[0])(*legacy[1])

    async def _log(self, params: Any) -> None:
        import warnings

        if self.calls:
            for session, request_id in list(self.calls.values()):
                await session.send_log_message(
                    params.level, params.data, params.logger, related_request_id=request_id
                )
            return
        for connection in self._older():
            with warnings.catch_warnings():  # connection-wide logs: only before 2026-07-28
                warnings.simplefilter("ignore")
                await connection.log(params.level, params.data, params.logger)

    def _older(self) -> list[Any]:
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        return [
            connection
            for connection in list(self.connections)
            if getattr(connection, "protocol_version", None) not in MODERN_PROTOCOL_VERSIONS
        ]


async def sync_tools(
    harness: Harness,
    downstream: ClientSession,
    registered: dict[str, Any],
    *,
    timeouts_ms: Mapping[str, int] | None = None,
    default_timeout_ms: int | None = None,
    tracer_provider: Any = None,
) -> None:
    """Bring ``harness``'s tools in line with what the downstream lists now: a tool gone
    is removed, a new one registered with its budget, a changed one replaced.
    ``registered`` (name -> registration) is kept by the caller across calls."""
    listed = {
        tool.name: tool
        for tool in await mcp_tools(
            downstream,
            timeouts_ms=timeouts_ms,
            default_timeout_ms=default_timeout_ms,
            tracer_provider=tracer_provider,
        )
    }
    for name in list(registered):
        if name not in listed:
            registered.pop(name).dispose()
    for name, tool in listed.items():
        current = harness.tools.get(name)
        if name in registered and current is not None and _same_tool(current, tool):
            continue
        if name in registered:
            registered.pop(name).dispose()
        registered[name] = harness.tools.register(tool)


def tracing_provider(harness: Harness) -> Any:
    """The tracer provider the harness's ``Tracing`` reports to (``None``: the global
    one, or no ``Tracing``)."""
    from guardstack.wrappers import Tracing

    for handle in harness.plugins:
        if isinstance(handle.plugin, Tracing):
            return handle.plugin.tracer_provider
    return None


def _same_tool(one: ToolDefinition, other: ToolDefinition) -> bool:
    keys = ("description", "parameters", "timeout_ms", "idempotent", "destructive")
    return all(getattr(one, key, None) == getattr(other, key, None) for key in keys)


def proxy_server(
    harness: Harness,
    downstream: ClientSession,
    on_lost: Callable[[], None] | None = None,
    relay: NotificationRelay | None = None,
    tracer_provider: Any = None,
) -> Any:
    """The ``mcp-proxy`` MCP server (the SDK's low-level ``Server``) in front of
    ``downstream``: its tools through ``harness``, everything else it offers —
    prompts, resources, resource templates, completions, subscriptions — passed
    through unchanged. Each client session is one conversation and one turn."""
    require("mcp", EXTRA)
    from mcp.server.lowlevel import NotificationOptions, Server

    conversations: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
    calls = itertools.count(1)
    # The SDK's own server span (global provider) parents the call's spans; with another
    # provider for Tracing, the proxy makes the server span there, from the request's _meta.
    server_tracer = client_tracer(tracer_provider)

    def conversation_of(ctx: Any) -> str:
        # the SDK hands each request its own ServerSession over one connection: the
        # connection is the client's session (over stdio, the only one)
        connection = getattr(ctx, "connection", None) or getattr(
            ctx.session, "_connection", ctx.session
        )
        key = conversations.get(connection)
        if key is None:
            key = conversations[connection] = f"mcp-proxy-{next(_connections)}"
            if relay is not None:
                relay.connections.add(connection)
        return key

    async def list_tools(ctx: Any, params: Any) -> Any:
        conversation_of(ctx)  # a client that lists tools hears of their changes
        return await downstream.list_tools(params=params)

    async def call_tool(ctx: Any, params: Any) -> CallToolResult:
        call = ToolCall(
            params.name,
            params.arguments or {},
            f"call_{next(calls)}",
            conversation=conversation_of(ctx),
        )
        answer, result = await serve_call(harness, ctx, call, server_tracer, relay)
        if on_lost is not None and result.error is not None and result.error.name == SERVER_GONE:
            on_lost()  # this answer goes out, then the proxy stops
        return answer

    handlers = _passthrough(downstream)
    if relay is not None:
        from mcp.server.subscriptions import ListenHandler

        handlers["on_subscriptions_listen"] = ListenHandler(relay.bus)
    import warnings

    from mcp.shared.exceptions import MCPDeprecationWarning

    with warnings.catch_warnings():  # logging/setLevel: deprecated at 2026-07-28, not before
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = Server(
            "guardstack-mcp-proxy", on_list_tools=list_tools, on_call_tool=call_tool, **handlers
        )
    offered = downstream.server_capabilities
    changes = NotificationOptions(
        prompts_changed=bool(offered and offered.prompts and offered.prompts.list_changed),
        resources_changed=bool(offered and offered.resources and offered.resources.list_changed),
        tools_changed=bool(offered and offered.tools and offered.tools.list_changed),
    )
    default_options = server.create_initialization_options

    def create_initialization_options(
        notification_options: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        # the list changes the downstream announces, the proxy relays: it says so too
        return default_options(notification_options or changes, *args, **kwargs)

    server.create_initialization_options = create_initialization_options  # type: ignore[method-assign]
    return server


async def serve_call(
    harness: Harness,
    ctx: Any,
    call: ToolCall,
    server_tracer: Any = None,
    relay: NotificationRelay | None = None,
) -> tuple[CallToolResult, ToolResult]:
    """Run one client's ``tools/call`` through ``harness``: the client's progress token
    relayed, its trace context joined (a server span when ``server_tracer`` is given),
    ``Approval`` asked of the person at the client; the MCP answer and guardstack's
    result."""
    from mcp.types import CallToolResult, TextContent

    meta = ctx.meta or {}
    token = meta.get("progress_token", meta.get("progressToken"))
    progress = _PROGRESS.set((ctx.session, token, ctx.request_id)) if token is not None else None
    in_flight = id(call)
    if relay is not None:
        relay.calls[in_flight] = (ctx.session, ctx.request_id)
    span = attached = None
    if server_tracer is not None:
        from opentelemetry.propagate import extract

        span = start_span(
            server_tracer,
            f"tools/call {call.name}",
            context=extract(dict(meta)) if meta else None,
            kind=SpanKind.SERVER,
            attributes={
                "mcp.method.name": "tools/call",
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "jsonrpc.request.id": str(ctx.request_id),
            },
        )
        attached = otel_context.attach(trace.set_span_in_context(span))
    calls = _calls_of(ctx)
    try:
        with anyio.CancelScope() as left:
            if calls is not None:
                calls.append(left)  # cancelled when the client's connection drops
            outcome = await harness.tools.execute(call)
    finally:
        if calls is not None:
            calls.remove(left)
        if progress is not None:
            _PROGRESS.reset(progress)
        if relay is not None:
            relay.calls.pop(in_flight, None)
        if attached is not None:
            otel_context.detach(attached)
    if left.cancelled_caught:  # nobody is there to read an answer: a short one
        if span is not None:
            _span_failed(span, "client_left")
            end_span(span)
        gone = ToolResult.failure("the client went away", name="ClientLeft", code=TOOL_ABORTED)
        return CallToolResult(
            content=[TextContent(type="text", text=gone.content)], is_error=True
        ), gone
    if outcome.pending is not None:  # Approval: ask the person at the client
        decision = await _ask_client(ctx, outcome.pending)
        outcome = await harness.tools.run_decided(call, decision, asked_by=outcome.pending.asked_by)
    result = outcome.result
    if span is not None:
        if result.is_error:
            _span_failed(span, "tool_error")
        end_span(span)
    original = result.value if isinstance(result.value, CallToolResult) else None
    if original is not None and not result.is_error:
        content = list(original.content)
        structured = original.structured_content
    else:
        content, structured = [TextContent(type="text", text=result.content)], None
    content.extend(TextContent(type="text", text=context.text) for context in outcome.contexts)
    answer = CallToolResult(
        content=content, structured_content=structured, is_error=result.is_error
    )
    return answer, result


def _passthrough(downstream: ClientSession) -> dict[str, Any]:
    """Handlers that forward what the downstream server offers besides tools, as it is."""
    offered = downstream.server_capabilities
    handlers: dict[str, Any] = {}
    if offered is None:
        return handlers
    if offered.prompts is not None:

        async def list_prompts(ctx: Any, params: Any) -> Any:
            return await downstream.list_prompts(params=params)

        async def get_prompt(ctx: Any, params: Any) -> Any:
            return await downstream.get_prompt(params.name, params.arguments)

        handlers |= {"on_list_prompts": list_prompts, "on_get_prompt": get_prompt}
    if offered.resources is not None:

        async def list_resources(ctx: Any, params: Any) -> Any:
            return await downstream.list_resources(params=params)

        async def list_templates(ctx: Any, params: Any) -> Any:
            return await downstream.list_resource_templates(params=params)

        async def read_resource(ctx: Any, params: Any) -> Any:
            return await downstream.read_resource(str(params.uri))

        handlers |= {
            "on_list_resources": list_resources,
            "on_list_resource_templates": list_templates,
            "on_read_resource": read_resource,
        }
        if offered.resources.subscribe:

            async def subscribe(ctx: Any, params: Any) -> Any:
                return await downstream.subscribe_resource(str(params.uri))

            async def unsubscribe(ctx: Any, params: Any) -> Any:
                return await downstream.unsubscribe_resource(str(params.uri))

            handlers |= {"on_subscribe_resource": subscribe, "on_unsubscribe_resource": unsubscribe}
    if offered.logging is not None:

        async def set_level(ctx: Any, params: Any) -> Any:
            return await downstream.set_logging_level(params.level)

        handlers["on_set_logging_level"] = set_level
    if offered.completions is not None:

        async def complete(ctx: Any, params: Any) -> Any:
            context = params.context.arguments if params.context is not None else None
            argument = {"name": params.argument.name, "value": params.argument.value}
            return await downstream.complete(params.ref, argument, context)

        handlers["on_completion"] = complete
    return handlers


async def serve_proxy(
    harness: Harness,
    downstream: ClientSession,
    read_stream: Any,
    write_stream: Any,
    relay: NotificationRelay | None = None,
    tracer_provider: Any = None,
) -> None:
    """Serve ``proxy_server`` over one MCP connection (stdio's streams).

    The downstream tool list passes through unchanged (the harness must already hold
    the tools from ``mcp_tools``, with their budgets); every call runs through the
    harness's stages as one conversation; a timeout, denial or failure is an MCP
    result with ``isError`` set and the seed's error text, and reminders are appended
    to the result as a text block. A call ``Approval`` pauses is asked of the person at
    the client through MCP elicitation (approve, reject with a reason, or — for flat
    arguments — edit them); a client that cannot elicit gets the call rejected, with a
    text saying why.
    """
    lost = anyio.Event()
    server = proxy_server(harness, downstream, lost.set, relay, tracer_provider)
    async with anyio.create_task_group() as group:

        async def stop_when_lost() -> None:
            await lost.wait()
            await anyio.sleep(0.2)  # let the answers to the pending calls go out first
            group.cancel_scope.cancel()

        group.start_soon(stop_when_lost)
        await server.run(read_stream, write_stream, server.create_initialization_options())
        group.cancel_scope.cancel()
    if lost.is_set():
        raise McpServerError("the MCP server behind the proxy stopped; the proxy stops too")


async def serve_proxy_http(
    harness: Harness,
    downstream: ClientSession,
    host: str,
    port: int,
    relay: NotificationRelay | None = None,
    tracer_provider: Any = None,
    gate: Gate | None = None,
    *,
    downstream_gone: anyio.Event | None = None,
    session_idle_s: float = 600.0,
    max_sessions: int = 500,
) -> None:
    """Serve ``proxy_server`` over streamable HTTP at ``http://host:port/mcp`` (the SDK's
    default path), until cancelled, behind ``gate`` (by default: no browser origin, and
    a ``Host`` that is ``host``, ``localhost`` or loopback — on every listen address).
    When ``downstream_gone`` is set, it stops after the answers in flight. A session
    idle ``session_idle_s`` ends; at most ``max_sessions`` are open at once."""
    import uvicorn

    running: Any = None
    gone: list[bool] = []

    def lost() -> None:
        gone.append(True)
        if running is not None:
            running.should_exit = True  # after the answers in flight

    server = proxy_server(harness, downstream, lost, relay, tracer_provider)
    gate = gate if gate is not None else Gate(host)
    inner = server.streamable_http_app(
        host=host,
        transport_security=checked_by_gate(),
        session_idle_timeout=session_idle_s,
        max_sessions=max_sessions,
        max_request_body_size=gate.max_body_bytes,
    )
    app = gated(inner, gate)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    running = uvicorn.Server(config)
    async with anyio.create_task_group() as group:
        if downstream_gone is not None:

            async def stop_when_gone() -> None:
                await downstream_gone.wait()
                lost()

            group.start_soon(stop_when_gone)
        await running.serve()
        group.cancel_scope.cancel()
    if gone:
        raise McpServerError("the MCP server behind the proxy stopped; the proxy stops too")


def checked_by_gate() -> Any:
    """The SDK's own Origin/Host checks are off: the gate makes them, on every address."""
    from mcp.server.transport_security import TransportSecuritySettings

    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


#: Where ``gated`` keeps, in a request's ASGI scope, the calls that request carries.
_CALLS: Final = "guardstack.mcp.calls"


def _calls_of(ctx: Any) -> list[anyio.CancelScope] | None:
    """The calls of the HTTP request ``ctx`` came in (``None``: not through ``gated``)."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    calls = scope.get(_CALLS) if isinstance(scope, dict) else None
    return calls if isinstance(calls, list) else None


def gated(inner: Any, gate: Gate) -> Any:
    """The ASGI app ``inner`` behind ``gate``'s checks: a refusal is a JSON-RPC error
    with the gate's status, never a 500. Lifespan events pass straight through. A
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
            await send(
                {
                    "type": "http.response.start",
                    "status": refused.status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
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
