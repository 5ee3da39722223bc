"""``guardstack mcp-proxy``: any MCP server's tools, through an assembled guard stack.

    guardstack mcp-proxy --config guards.yaml --timeout 'search_*=5000' -- npx some-mcp-server

Starts ``COMMAND [ARGS…]`` as the downstream MCP server (stdio) — or connects to
one over streamable HTTP (``--connect URL``) — registers its tools with their
budgets (``--timeout PATTERN=MS``, ``--default-timeout MS``) and idempotency (from
the server's annotations), applies the plugins of ``--config``, and serves the same
tools over this process's stdin/stdout, or over streamable HTTP (``--transport
http``, at ``http://LISTEN/mcp``, loopback unless ``--listen`` says otherwise).
Prompts, resources, resource templates and completions pass through unchanged.
The configuration is read before anything is started, so a bad file fails at once;
the child process is stopped when the client disconnects (stdio) or the proxy stops.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import anyio

from guardstack.cli.mcp_gateway import run_gateway
from guardstack.cli.watch import watch_config
from guardstack.gateway.mcp_gateway.config import is_gateway_config
from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.integrations._gate import Gate
from guardstack.integrations.mcp import (
    McpServerError,
    NotificationRelay,
    serve_proxy,
    serve_proxy_http,
    sync_tools,
    tracing_provider,
)
from guardstack.pipeline.errors import ConfigError, GuardstackError
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.values import MAX_TIMEOUT_MS, message_of
from guardstack.wrappers import Timeout

__all__ = ["parse_timeouts", "run_proxy"]


_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


def parse_ms(option: str, text: str) -> int:
    """A budget given on the command line: whole milliseconds from 1, or ``ConfigError``."""
    if not _WHOLE_NUMBER.fullmatch(text.strip()):
        raise ConfigError(
            f"mcp-proxy: {option} {text!r} is not a whole number of milliseconds",
            key=option,
            value=text,
        )
    ms = int(text)
    if not 0 < ms <= MAX_TIMEOUT_MS:
        raise ConfigError(
            f"mcp-proxy: {option} {text!r} must be from 1 to {MAX_TIMEOUT_MS} milliseconds",
            key=option,
            value=text,
        )
    return ms


def parse_timeouts(values: Sequence[str]) -> dict[str, int]:
    """``PATTERN=MS`` options as a mapping, or ``ConfigError`` naming the bad one."""
    timeouts = {}
    for value in values:
        pattern, separator, ms = value.rpartition("=")
        if not separator or not pattern:
            raise ConfigError(
                f"mcp-proxy: --timeout {value!r} must be PATTERN=MS, e.g. 'search_*=5000'",
                key="timeout",
                value=value,
            )
        timeouts[pattern] = parse_ms(f"--timeout {pattern}=", ms)
    return timeouts


def _enforces_budgets(harness: Harness) -> bool:
    return any(
        isinstance(handle.plugin, ToolCallTimeoutPolicy)
        or (isinstance(handle.plugin, Timeout) and handle.plugin.stage == "dispatch")
        for handle in harness.plugins
    )


async def run_proxy(
    config: Path | None,
    command: Sequence[str],
    *,
    allow_imports: bool = False,
    timeouts_ms: dict[str, int] | None = None,
    default_timeout_ms: int | None = None,
    transport: str = "stdio",
    listen: str = "127.0.0.1:8808",
    connect: str | None = None,
    keys: Path | None = None,
    allow_origins: list[str] | None = None,
    allow_hosts: list[str] | None = None,
    session_idle_s: float = 600.0,
    max_sessions: int = 500,
    store: str | None = None,
    decision_log: str = "-",
    watch: bool = False,
    metrics_listen: str | None = None,
) -> None:
    """Proxy ``command``'s MCP server (or the one at ``connect``) over stdio until the
    client disconnects, or over streamable HTTP until stopped; with a gateway's
    ``config`` (a mapping with ``servers``), serve every server it lists
    (``cli.mcp_gateway``)."""
    host, port = _listen(listen)
    gate = Gate(
        host, allow_origins=tuple(allow_origins or ()), allow_hosts=tuple(allow_hosts or ())
    )
    if config is not None and is_gateway_config(config):
        if command or connect is not None:
            raise ConfigError(
                f"mcp-proxy: {config} lists the servers of a gateway; give no -- COMMAND "
                "or --connect with it",
                key="servers",
            )
        if timeouts_ms or default_timeout_ms is not None:
            raise ConfigError(
                f"mcp-proxy: {config} lists the servers of a gateway; give their budgets "
                "there (timeouts_ms under each server), not with --timeout",
                key="timeout",
            )
        await _fatal_in_one_line(
            run_gateway(
                config,
                keys=keys,
                allow_imports=allow_imports,
                transport=transport,
                host=host,
                port=port,
                allow_origins=allow_origins,
                allow_hosts=allow_hosts,
                session_idle_s=session_idle_s,
                max_sessions=max_sessions,
                store=store,
                decision_log=decision_log,
                watch=watch,
                metrics_listen=metrics_listen,
            )
        )
        return
    if keys is not None:
        raise ConfigError(
            "mcp-proxy: --keys is for a gateway (a --config that lists servers)", key="keys"
        )
    if connect is not None and command:
        raise ConfigError("mcp-proxy: give either --connect URL or -- COMMAND, not both")
    if connect is None and not command:
        raise ConfigError("mcp-proxy: give the server to start after --, e.g. -- npx server")
    harness = Harness()
    if config is not None:
        harness.load(config, allow_imports=allow_imports)
    if (timeouts_ms or default_timeout_ms is not None) and not _enforces_budgets(harness):
        # Budgets declared on the command line are the tools' own: enforce them.
        harness.plugin(ToolCallTimeoutPolicy())
    telemetry = export_from_environment("guardstack-mcp-proxy")

    async def serving() -> None:
        if transport == "http":
            await _fatal_in_one_line(
                _proxy_http(
                    harness,
                    command,
                    connect,
                    gate,
                    port,
                    timeouts_ms,
                    default_timeout_ms,
                    (session_idle_s, max_sessions),
                )
            )
        else:
            await _proxy_stdio(harness, command, connect, timeouts_ms, default_timeout_ms)

    async def watched(config: Path) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: watch_config(harness, config, allow_imports=allow_imports))
            await serving()
            group.cancel_scope.cancel()

    try:
        if watch and config is not None:
            await _fatal_in_one_line(watched(config))  # its failures, one line as ever
        else:
            await serving()
    finally:
        if telemetry is not None:
            telemetry.shutdown()  # flush what the proxy traced


def metrics_reader(listen: str | None) -> Any:
    """``--metrics-listen``'s Prometheus reader (``None`` without it); its address
    checked before anything starts."""
    if listen is None:
        return None
    _listen(listen)
    from guardstack.gateway.metrics_endpoint import prometheus_reader

    return prometheus_reader()


async def serve_metrics_at(listen: str, gate: Gate, name: str) -> None:
    """``GET /metrics`` on ``listen`` (``--metrics-listen``), with ``gate``'s browser
    checks, until cancelled."""
    from guardstack.gateway.metrics_endpoint import serve_metrics

    host, port = _listen(listen)
    print(f"guardstack {name}: metrics at http://{host}:{port}/metrics", file=sys.stderr,
          flush=True)  # fmt: skip
    checks = Gate(host, allow_origins=gate.allow_origins, allow_hosts=gate.allow_hosts)
    await serve_metrics(checks, port)


def export_from_environment(service: str, scraped: Any = None) -> Any:
    """With ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) set, the proxy's
    traces, metrics and logs go there over OTLP/HTTP, as the global providers (so the MCP
    SDK's own spans join guardstack's); ``None`` otherwise. ``scraped``: a Prometheus
    reader (``--metrics-listen``) the global meter provider also reports through."""
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        if scraped is not None:
            from guardstack.gateway.metrics_endpoint import meter_provider

            return _Scraped(meter_provider([scraped]))
        return None
    try:
        from guardstack.integrations.otel import configure

        return configure(service_name=service, readers=[scraped] if scraped else ())
    except ImportError:
        raise ConfigError(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set: sending the proxy's telemetry needs "
            "pip install 'guardstack[otlp]'",
            key="OTEL_EXPORTER_OTLP_ENDPOINT",
        ) from None


class _Scraped:
    """The meter provider ``--metrics-listen`` installed, shut down with the gateway."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def shutdown(self) -> None:
        self.provider.shutdown()


async def _proxy_stdio(
    harness: Harness,
    command: Sequence[str],
    connect: str | None,
    timeouts_ms: dict[str, int] | None,
    default_timeout_ms: int | None,
) -> None:
    from mcp.server.stdio import stdio_server

    try:
        async with stdio_server() as (server_read, server_write):
            try:
                await _proxy(
                    harness,
                    command,
                    connect,
                    server_read,
                    server_write,
                    timeouts_ms,
                    default_timeout_ms,
                )
            except Exception as error:
                _exit_now(error)
            finally:
                await server_write.aclose()  # else stdio_server waits to write forever
    except BaseExceptionGroup as group:
        raise _first_reportable(group) from None


def _exit_now(error: Exception) -> NoReturn:
    """One line on stderr and exit 2, without waiting for stdin: the SDK's stdio reader is a
    thread blocked on it until the client closes it, which a client waiting for our answer
    never does. The downstream server is already stopped (its context has exited)."""
    reportable = _first_reportable(error) if isinstance(error, BaseExceptionGroup) else error
    print(f"guardstack: {message_of(reportable)}", file=sys.stderr, flush=True)
    os._exit(2)


async def _proxy(
    harness: Harness,
    command: Sequence[str],
    connect: str | None,
    server_read: Any,
    server_write: Any,
    timeouts_ms: dict[str, int] | None,
    default_timeout_ms: int | None,
) -> None:
    """Start the downstream server and serve its tools; the client's messages are read
    from the start, so a client that goes away (stdin closes) while the server is still
    starting stops the proxy — and its child — instead of waiting for a server that may
    never answer ``initialize``."""
    send, receive = anyio.create_memory_object_stream[Any](max_buffer_size=64)
    ready = False
    async with anyio.create_task_group() as group:

        async def pump() -> None:
            async with send:
                async for message in server_read:
                    await send.send(message)
            if not ready:
                group.cancel_scope.cancel()  # the client left first

        group.start_soon(pump)
        relay = NotificationRelay()
        async with _downstream(command, connect, relay) as downstream:
            await _keep_tools(harness, downstream, relay, timeouts_ms, default_timeout_ms)
            ready = True
            await serve_proxy(
                harness, downstream, receive, server_write, relay, tracing_provider(harness)
            )
        group.cancel_scope.cancel()


def _listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"--listen {listen!r} must be HOST:PORT, e.g. 127.0.0.1:8808",
            key="listen",
            value=listen,
        )
    return host, int(port)


async def _keep_tools(
    harness: Harness,
    downstream: Any,
    relay: NotificationRelay,
    timeouts_ms: dict[str, int] | None,
    default_timeout_ms: int | None,
) -> None:
    """Register the downstream's tools now, and again whenever it says they changed."""
    registered: dict[str, Any] = {}

    async def sync() -> None:
        await sync_tools(
            harness,
            downstream,
            registered,
            timeouts_ms=timeouts_ms,
            default_timeout_ms=default_timeout_ms,
            tracer_provider=tracing_provider(harness),
        )

    await sync()
    relay.on_tools_changed = sync


@contextlib.asynccontextmanager
async def _downstream(
    command: Sequence[str], connect: str | None, relay: NotificationRelay
) -> AsyncIterator[Any]:
    """The downstream server's session: a child over stdio, or a server over HTTP."""
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    if connect is not None:
        async with (
            streamable_http_client(connect) as streams,
            ClientSession(streams[0], streams[1], message_handler=relay) as session,
        ):
            await session.initialize()
            yield session
        return
    params = StdioServerParameters(command=command[0], args=list(command[1:]))
    async with (
        stdio_client(params, errlog=sys.stderr) as (read, write),
        ClientSession(read, write, message_handler=relay) as session,
    ):
        await session.initialize()
        yield session


async def _fatal_in_one_line(running: Awaitable[None]) -> None:
    """Run ``running``; what ends it other than a stop is a ``GuardstackError`` whose
    message is the one line ``main`` prints (exit 2), never an exception group."""
    try:
        await running
    except (GuardstackError, OSError):
        raise
    except BaseExceptionGroup as group:
        reportable = _first_reportable(group)
        if isinstance(reportable, GuardstackError | OSError):
            raise reportable from None
        if isinstance(reportable, KeyboardInterrupt | SystemExit):
            raise reportable from None
        raise McpServerError(message_of(reportable)) from None
    except Exception as error:
        raise McpServerError(message_of(error)) from None


async def _proxy_http(
    harness: Harness,
    command: Sequence[str],
    connect: str | None,
    gate: Gate,
    port: int,
    timeouts_ms: dict[str, int] | None,
    default_timeout_ms: int | None,
    sessions: tuple[float, int] = (600.0, 500),
) -> None:
    relay = NotificationRelay()
    held: list[Any] = []
    failed: list[BaseException] = []
    ready, gone, stop = anyio.Event(), anyio.Event(), anyio.Event()

    async def hold() -> None:
        # In a task of its own: a downstream whose connection fails ends this task only,
        # so the calls waiting on it are answered (the session fails them) and the
        # server stops after its answers, instead of being torn down mid-response.
        try:
            async with _downstream(command, connect, relay) as downstream:
                await _keep_tools(harness, downstream, relay, timeouts_ms, default_timeout_ms)
                held.append(downstream)
                ready.set()
                await stop.wait()
        except Exception as error:
            failed.append(error)
        finally:
            ready.set()
            gone.set()

    async with anyio.create_task_group() as group:
        group.start_soon(hold)
        await ready.wait()
        if not held:
            raise failed[0] if failed else McpServerError("the MCP server did not start")
        print(
            f"guardstack mcp-proxy: serving http://{gate.listen_host}:{port}/mcp",
            file=sys.stderr,
            flush=True,
        )
        await serve_proxy_http(
            harness,
            held[0],
            gate.listen_host,
            port,
            relay,
            tracing_provider(harness),
            gate,
            downstream_gone=gone,
            session_idle_s=sessions[0],
            max_sessions=sessions[1],
        )
        stop.set()
    if failed:
        raise McpServerError("the MCP server behind the proxy stopped; the proxy stops too")


def _first_reportable(group: BaseExceptionGroup[Any]) -> BaseException:
    """The error a person should read out of a task group's: guardstack's own, else the first."""
    leaves: list[BaseException] = []

    def walk(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                walk(inner)
        else:
            leaves.append(error)

    walk(group)
    for wanted in (GuardstackError, OSError):
        for leaf in leaves:
            if isinstance(leaf, wanted):
                return leaf
    return leaves[0] if leaves else group
