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

from guardstack.integrations.mcp.gate import checked_by_gate, gated
from guardstack.integrations.mcp.relay import NotificationRelay
from guardstack.integrations.mcp.serve import (
    NOTE_FIELD,
    proxy_server,
    serve_call,
    serve_proxy,
    serve_proxy_http,
    with_note_field,
)
from guardstack.integrations.mcp.tools import (
    EXTRA,
    MAX_PAGES,
    OWNER,
    SERVER_GONE,
    McpServerError,
    client_tracer,
    mcp_tools,
    metering_provider,
    render_content,
    sync_tools,
    tracing_provider,
)

__all__ = [
    "EXTRA",
    "MAX_PAGES",
    "NOTE_FIELD",
    "OWNER",
    "SERVER_GONE",
    "McpServerError",
    "NotificationRelay",
    "checked_by_gate",
    "client_tracer",
    "gated",
    "mcp_tools",
    "metering_provider",
    "proxy_server",
    "render_content",
    "serve_call",
    "serve_proxy",
    "serve_proxy_http",
    "sync_tools",
    "tracing_provider",
    "with_note_field",
]
