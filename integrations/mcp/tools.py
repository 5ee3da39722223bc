"""MCP servers' tools as guardstack tools: ``mcp_tools``, ``sync_tools``, and how an MCP
result becomes a ``ToolResult`` (see the package docstring)."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider

from guardstack.integrations._extras import require
from guardstack.integrations._framework import budgets
from guardstack.pipeline import (
    GuardstackError,
    Harness,
    ToolCall,
    ToolDefinition,
    ToolResult,
)
from guardstack.pipeline.validate import cut
from guardstack.pipeline.values import (
    TOOL_UNAVAILABLE,
    failed_result,
    validate_timeout_ms,
)
from guardstack.wrappers._otel import VERSION, check_provider, end_span, start_span

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult, Tool

__all__ = [
    "EXTRA",
    "MAX_PAGES",
    "OWNER",
    "SERVER_GONE",
    "McpServerError",
    "client_tracer",
    "mcp_tools",
    "metering_provider",
    "render_content",
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
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> list[ToolDefinition]:
    """A ``ToolDefinition`` for every tool the session's server lists (all pages).

    Each call's duration is the MCP conventions' ``mcp.client.operation.duration``
    histogram, in ``meter_provider`` (``None``: the global one).

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
                _caller(
                    session,
                    tool.name,
                    client_tracer(tracer_provider),
                    operation_duration("client", meter_provider),
                ),
                tool.description or "",
                dict(tool.input_schema),
                budget,
                _idempotent(tool),
                destructive=_destructive(tool),
            )
        )
    return definitions


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


def _forward_progress(call: ToolCall) -> Any:
    """A ``progress_callback`` that tells the call (a ``Timeout(idle_ms=…)`` then bounds
    the gaps between the server's reports) and relays the downstream's progress to the
    proxy's client; ``None`` when nobody listens (the server is then asked for none)."""
    scope = call.scope  # the proxy's client: its session, progress token and request id
    wanted = scope.progress if scope is not None else None
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


def client_tracer(provider: TracerProvider | None) -> Tracer | None:
    """A tracer for guardstack's own MCP client spans, or ``None`` when the SDK's spans
    already land in ``provider`` (it is the global one, or none was given)."""
    if check_provider(OWNER, "tracer_provider", provider, "get_tracer") is None:
        return None
    if provider is None or provider is trace.get_tracer_provider():
        return None
    return provider.get_tracer("guardstack.mcp", VERSION)


def operation_duration(side: str, provider: Any = None) -> Any:
    """The MCP conventions' ``mcp.{client,server}.operation.duration`` histogram (seconds),
    from ``provider`` or the global one (the MCP SDK records none of its own)."""
    provider = provider if provider is not None else metrics.get_meter_provider()
    made = _HISTOGRAMS.get((id(provider), side))
    if made is None:
        meter = provider.get_meter("guardstack.mcp", VERSION)
        made = _HISTOGRAMS[(id(provider), side)] = meter.create_histogram(
            f"mcp.{side}.operation.duration",
            unit="s",
            description=f"MCP request duration as the {side} observes it",
            explicit_bucket_boundaries_advisory=MCP_BUCKETS,
        )
    return made


#: Each meter provider's histograms, made once.
_HISTOGRAMS: dict[tuple[int, str], Any] = {}


#: The MCP conventions' duration buckets (seconds).
MCP_BUCKETS: Final = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300]


def record_operation(
    histogram: Any, started: float, name: str, error_type: str | None, session: Any = None
) -> None:
    """One ``tools/call``'s point: its tool, and ``error.type`` when it failed."""
    attributes = {
        "mcp.method.name": "tools/call",
        "gen_ai.tool.name": name,
        "gen_ai.operation.name": "execute_tool",
        **_session_attributes(session),
    }
    if error_type is not None:
        attributes["error.type"] = error_type
    histogram.record(anyio.current_time() - started, attributes)


def _caller(session: ClientSession, name: str, tracer: Any = None, durations: Any = None) -> Any:
    from mcp.shared.exceptions import MCPError
    from mcp.types import CONNECTION_CLOSED

    durations = durations if durations is not None else operation_duration("client")

    async def call_tool(arguments: Mapping[str, Any], call: ToolCall) -> ToolResult:
        # Cancelling this await (a guardstack timeout) makes the SDK send the server
        # notifications/cancelled for the request.
        span = token = None
        started, failed = anyio.current_time(), None
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
            failed = "connection_closed"
            span_failed(span, failed)
            return _gone(name)
        except MCPError as error:
            failed = str(error.error.code)
            span_failed(span, failed)
            if error.error.code == CONNECTION_CLOSED:
                return _gone(name)
            raise
        except BaseException as error:
            failed = type(error).__qualname__
            span_failed(span, failed)
            raise
        else:
            if result.is_error:
                failed = "tool_error"
                span_failed(span, failed)
        finally:
            record_operation(durations, started, name, failed, session)
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


def span_failed(span: Any, error_type: str) -> None:
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


async def sync_tools(
    harness: Harness,
    downstream: ClientSession,
    registered: dict[str, Any],
    *,
    timeouts_ms: Mapping[str, int] | None = None,
    default_timeout_ms: int | None = None,
    tracer_provider: TracerProvider | None = None,
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
            meter_provider=metering_provider(harness),
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


def tracing_provider(harness: Harness) -> TracerProvider | None:
    """The tracer provider the harness's ``Tracing`` reports to (``None``: the global
    one, or no ``Tracing``)."""
    from guardstack.wrappers import Tracing

    for handle in harness.plugins:
        if isinstance(handle.plugin, Tracing):
            return handle.plugin.tracer_provider
    return None


def metering_provider(harness: Harness) -> MeterProvider | None:
    """The meter provider the harness's ``Metrics`` reports to (``None``: the global one,
    or no ``Metrics``)."""
    from guardstack.wrappers import Metrics

    for handle in harness.plugins:
        provider: MeterProvider | None = getattr(handle.plugin, "meter_provider", None)
        if isinstance(handle.plugin, Metrics) and provider is not None:
            return provider
    return None


def _same_tool(one: ToolDefinition, other: ToolDefinition) -> bool:
    keys = ("description", "parameters", "timeout_ms", "idempotent", "destructive")
    return all(getattr(one, key, None) == getattr(other, key, None) for key in keys)
