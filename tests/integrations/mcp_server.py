"""A real MCP server for the tests, written with the official SDK, served over stdio.

    python -m tests.integrations.mcp_server LOG_FILE

Its tools cover what a guard stack must handle: ``echo`` (read-only), ``search``
(for loops), ``slow`` (answers after a while), ``hang`` (never answers, and writes
``cancelled hang`` to the log file when the client cancels it), ``fail`` (an MCP
error result), ``send_email`` (not idempotent: counts its runs in the log, and
fails its first run so a retry would show), ``picture`` (image content) and
``data`` (structured content only), ``crash`` (the server exits mid-call), ``chatty``
(log messages while it runs), ``grow`` (adds the tool ``grown`` and says the tool
list and a resource changed). Every run
is logged as ``run <tool>``. It also
offers a prompt (``review``), resources (``notes://today``, the template
``notes://{day}``) and completions, which a proxy must pass through. With a port
after the log file it serves streamable HTTP there instead of stdio. With ``--spans`` it
traces itself (the SDK's own server spans) to ``LOG_FILE.spans.jsonl``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

SPANS = "--spans" in sys.argv  # write the SDK's spans to LOG_FILE.spans.jsonl
if SPANS:
    sys.argv.remove("--spans")
LOG = Path(sys.argv[1]) if len(sys.argv) > 1 else None
server = MCPServer("guardstack-test-server")
_sends = 0


def log(line: str) -> None:
    if LOG is not None:
        with LOG.open("a", encoding="utf-8") as file:
            file.write(line + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(message: str) -> str:
    """Say the text back."""
    log("run echo")  # takes `message`, as the everything server's echo does
    return message


@server.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def search(query: str) -> str:
    """Search for a query."""
    log("run search")
    return f"no results for {query!r}"


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after ``seconds``."""
    log("run slow")
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
async def hang() -> str:
    """Never answer."""
    log("run hang")
    try:
        await anyio.sleep(3600)
    except anyio.get_cancelled_exc_class():
        log("cancelled hang")
        raise
    return "unreachable"


@server.tool()
def fail(reason: str = "it broke") -> str:
    """Always fail."""
    log("run fail")
    raise ToolError(reason)


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
def send_email(to: str) -> str:
    """Send an email (must never run twice for one request)."""
    global _sends
    _sends += 1
    log("run send_email")
    if _sends == 1:
        raise ToolError("SMTP server said 451, try again later")
    return f"sent to {to}"


@server.tool()
def picture() -> Image:
    """A tiny PNG."""
    log("run picture")
    return Image(data=b"\x89PNG\r\n\x1a\nfake", format="png")


@server.tool(structured_output=True)
def data() -> dict[str, int]:
    """Structured numbers."""
    log("run data")
    return {"answer": 42}


@server.tool()
async def count(n: int, ctx: Context) -> str:
    """Count to n, reporting progress at each step."""
    for step in range(1, n + 1):
        await ctx.report_progress(step, n, f"step {step}")
        await anyio.sleep(0.01)
    return f"counted to {n}"


@server.tool()
async def chatty(n: int, ctx: Context) -> str:
    """Send n log messages while it runs (the logging capability, before 2026-07-28)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(1, n + 1):
            await ctx.info(f"working on {step} of {n}", logger_name="chatty")
    return f"said {n} things"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool ``grown`` and tell the client its tools changed; tell it too that
    ``notes://today`` changed."""

    def grown() -> str:
        """A tool that was not there at the start."""
        log("run grown")
        return "grown ran"

    if "grown" not in [tool.name for tool in await server.list_tools()]:
        server.add_tool(grown, name="grown")
    await ctx.session.send_tool_list_changed()
    await ctx.session.send_resource_updated("notes://today")
    return "grew"


@server.tool()
async def crash() -> str:
    """Kill this server mid-call (for the proxy's test of a downstream that dies)."""
    log("run crash")
    await anyio.sleep(0.2)
    os._exit(3)


@server.prompt()
def review(language: str) -> str:
    """Ask for a code review."""
    return f"Review this {language} code carefully."


@server.resource("notes://today")
def today() -> str:
    """Today's notes."""
    return "ship the proxy"


@server.resource("notes://{day}")
def notes(day: str) -> str:
    """The notes of one day."""
    return f"notes for {day}"


@server.completion()  # type: ignore[untyped-decorator,no-untyped-call]  # untyped in the SDK
async def complete(ref: object, argument: object, context: object) -> object:
    from mcp.types import Completion

    value = getattr(argument, "value", "")
    languages = [name for name in ("python", "pascal", "perl") if name.startswith(value)]
    return Completion(values=languages)


def trace_to_file(path: Path) -> None:
    """The MCP SDK instruments itself through the global tracer provider: install one that
    writes each finished span as a JSON line (name, kind, trace, span and parent ids), so a
    test can see whether this server's spans joined the caller's trace."""
    import json

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class ToFile(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            with path.open("a", encoding="utf-8") as file:
                for span in spans:  # type: ignore[attr-defined]
                    parent = span.parent.span_id if span.parent is not None else None
                    record = {
                        "name": span.name,
                        "kind": span.kind.name,
                        "trace_id": format(span.context.trace_id, "032x"),
                        "span_id": format(span.context.span_id, "016x"),
                        "parent_id": format(parent, "016x") if parent is not None else None,
                    }
                    file.write(json.dumps(record) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ToFile()))
    trace.set_tracer_provider(provider)


if __name__ == "__main__":
    log(f"pid {os.getpid()}")
    if SPANS and LOG is not None:
        trace_to_file(LOG.with_suffix(".spans.jsonl"))
    if len(sys.argv) > 2:  # streamable HTTP on this port, for the HTTP proxy test
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run("stdio")
