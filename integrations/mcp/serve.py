"""The proxy's MCP server: the downstream's tools through the harness, the rest passed
through; ``serve_call`` runs one client's ``tools/call`` (the gateway's too)."""

from __future__ import annotations

import itertools
import json
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import anyio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer, TracerProvider

from guardstack.integrations._extras import require
from guardstack.integrations._gate import Gate, serve
from guardstack.integrations.mcp.gate import calls_of, checked_by_gate, gated
from guardstack.integrations.mcp.relay import NotificationRelay
from guardstack.integrations.mcp.tools import (
    EXTRA,
    SERVER_GONE,
    McpServerError,
    client_tracer,
    metering_provider,
    operation_duration,
    record_operation,
    span_failed,
)
from guardstack.pipeline import (
    Approve,
    Edit,
    Harness,
    PendingApproval,
    Reject,
    ToolCall,
    ToolResult,
)
from guardstack.pipeline.approval import Decision
from guardstack.pipeline.values import (
    TOOL_ABORTED,
)
from guardstack.wrappers._otel import end_span, start_span

logger = logging.getLogger("guardstack")

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult, Tool

__all__ = [
    "proxy_server",
    "serve_call",
    "serve_proxy",
    "serve_proxy_http",
]


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


_connections = itertools.count(1)


def proxy_server(
    harness: Harness,
    downstream: ClientSession,
    on_lost: Callable[[], None] | None = None,
    relay: NotificationRelay | None = None,
    tracer_provider: TracerProvider | None = None,
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
        listed = await downstream.list_tools(params=params)
        return listed.model_copy(update={"tools": [with_note_field(t) for t in listed.tools]})

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


#: Where a guard's note to the model goes in a structured result (``with_note_field``).
NOTE_FIELD: Final = "guardstack_note"


def with_note_field(tool: Tool) -> Tool:
    """A tool as served: an object output schema gains an optional ``guardstack_note``
    string, so a result with the guards' note in its structured content stays valid
    against the schema the client was given (a schema that forbids other properties
    included)."""
    schema = getattr(tool, "output_schema", None)
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return tool
    properties = dict(schema.get("properties") or {})
    properties.setdefault(
        NOTE_FIELD,
        {
            "type": "string",
            "description": "A note from the gateway's guards to the model (a loop noticed, "
            "a budget nearly spent), when there is one.",
        },
    )
    return tool.model_copy(update={"output_schema": {**schema, "properties": properties}})


async def serve_call(
    harness: Harness,
    ctx: Any,
    call: ToolCall,
    server_tracer: Tracer | None = None,
    relay: NotificationRelay | None = None,
) -> tuple[CallToolResult, ToolResult]:
    """Run one client's ``tools/call`` through ``harness``: the client's progress token
    relayed, its trace context joined (a server span when ``server_tracer`` is given),
    ``Approval`` asked of the person at the client; the MCP answer and guardstack's
    result."""
    from mcp.types import CallToolResult, TextContent

    started = anyio.current_time()
    durations = operation_duration("server", metering_provider(harness))
    meta = ctx.meta or {}
    token = meta.get("progress_token", meta.get("progressToken"))
    if token is not None:  # where the downstream's progress goes: carried by the call
        call = call.scoped(progress=(ctx.session, token, ctx.request_id))
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
    calls = calls_of(ctx)
    try:
        with anyio.CancelScope() as left:
            if calls is not None:
                calls.append(left)  # cancelled when the client's connection drops
            outcome = await harness.tools.execute(call)
    finally:
        if calls is not None:
            calls.remove(left)
        if relay is not None:
            relay.calls.pop(in_flight, None)
        if attached is not None:
            otel_context.detach(attached)
    if left.cancelled_caught:  # nobody is there to read an answer: a short one
        record_operation(durations, started, call.name, "client_left")
        if span is not None:
            span_failed(span, "client_left")
            end_span(span)
        gone = ToolResult.failure("the client went away", name="ClientLeft", code=TOOL_ABORTED)
        return CallToolResult(
            content=[TextContent(type="text", text=gone.content)], is_error=True
        ), gone
    if outcome.pending is not None:  # Approval: ask the person at the client
        decision = await _ask_client(ctx, outcome.pending)
        outcome = await harness.tools.run_decided(call, decision, asked_by=outcome.pending.asked_by)
    result = outcome.result
    failed = "tool_error" if result.is_error else None
    record_operation(durations, started, call.name, failed)
    if span is not None:
        if result.is_error:
            span_failed(span, "tool_error")
        end_span(span)
    original = result.value if isinstance(result.value, CallToolResult) else None
    if original is not None and not result.is_error:
        content = list(original.content)
        structured = original.structured_content
    else:
        content, structured = [TextContent(type="text", text=result.content)], None
    notes = [context.text for context in outcome.contexts]
    content.extend(TextContent(type="text", text=note) for note in notes)
    if notes and isinstance(structured, dict):
        # clients that show the model the structured result (Claude Code, Codex) read it
        # there: under NOTE_FIELD, which the served output schema declares
        structured = {**structured, NOTE_FIELD: "\n\n".join(notes)}
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
    tracer_provider: TracerProvider | None = None,
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
    tracer_provider: TracerProvider | None = None,
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
        await serve(running)
        group.cancel_scope.cancel()
    if gone:
        raise McpServerError("the MCP server behind the proxy stopped; the proxy stops too")
