"""``guardstack mcp-proxy --config gateway.yaml``: several MCP servers behind one front door.

    guardstack mcp-proxy --config gateway.yaml --keys keys.yaml --transport http

When ``--config`` is a mapping with ``servers`` (not a plain plugin list), the proxy is
a gateway: it starts (or connects to) every server the file lists, keeps each running
(restarting one that dies, with backoff, while the others serve on), and serves their
tools, prompts and resources as ``<server>_<name>`` through the guard stack of the
file's ``plugins``. With ``--keys``, each client key is a tenant that sees only the
servers and tools it is given, within its daily quotas. Both files are read and checked
before anything starts: a bad one is one line naming file, key and value, and exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio

from guardstack.integrations._gate import Gate, serve
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness

__all__ = ["load_gateway", "run_gateway"]


def load_gateway(
    config: Path,
    keys: Path | None = None,
    *,
    allow_imports: bool = False,
    store: str | None = "memory",
) -> tuple[Any, Harness]:
    """The gateway ``config`` (and ``keys``, a tenants file) describe, and its harness
    — on the store ``--store`` names (``None``: the default, SQLite) unless its plugins
    name one; nothing started."""
    from guardstack.cli.stores import store_from
    from guardstack.gateway.mcp_gateway import Gateway, read_gateway, read_keys
    from guardstack.pipeline.plugin_config import STORE_ENTRIES

    described = read_gateway(config)
    named = any(entry.get("name") in STORE_ENTRIES for entry in described.plugins)
    if named and store not in (None, "memory"):
        raise ConfigError(
            f"mcp-proxy: --store {store!r} and a store entry in {config}: give one",
            key="store",
        )
    harness = Harness(store=None if named else store_from(store))
    try:
        harness.load(list(described.plugins), allow_imports=allow_imports)
    except ConfigError as error:
        raise ConfigError(
            f"{config}: plugins: {error}",
            plugin=error.plugin,
            key=error.key,
            value=error.value,
            reason=error.reason,
        ) from error
    tenants = read_keys(keys, described.names()) if keys is not None else None
    return Gateway(harness, described, keys=tenants), harness


async def run_gateway(
    config: Path,
    *,
    keys: Path | None = None,
    allow_imports: bool = False,
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8808,
    allow_origins: list[str] | None = None,
    allow_hosts: list[str] | None = None,
    session_idle_s: float = 600.0,
    max_sessions: int = 500,
    store: str | None = None,
    decision_log: str = "-",
    watch: bool = False,
    metrics_listen: str | None = None,
) -> None:
    """Serve the gateway over stdio until the client leaves, or over HTTP until stopped
    (``watch``: its plugins reloaded when ``config`` changes; ``metrics_listen``: its
    metrics for a Prometheus, at ``GET /metrics`` there)."""
    from guardstack.cli.stores import describe_store, forgets, say
    from guardstack.gateway.decision_log import DecisionLog

    if keys is not None and transport != "http":
        raise ConfigError(
            "mcp-proxy: --keys needs --transport http (over stdio the client is the one "
            "process that started the gateway)",
            key="keys",
        )
    from guardstack.cli.mcp_proxy import export_from_environment, metrics_reader

    scraped = metrics_reader(metrics_listen)
    telemetry = export_from_environment("guardstack-mcp-gateway", scraped)
    gateway, harness = load_gateway(config, keys, allow_imports=allow_imports, store=store)
    say(f"guardstack mcp-proxy: counts kept in {describe_store(harness.store)}")
    lost = await forgets(harness.store)
    if lost is not None:
        say(f"guardstack mcp-proxy: warning: {lost}")
    log = DecisionLog(decision_log).attach()
    try:
        async with anyio.create_task_group() as group:
            if watch:
                group.start_soon(watch_gateway, harness, config, allow_imports)
            if metrics_listen is not None:
                from guardstack.cli.mcp_proxy import serve_metrics_at

                checks = Gate(host, allow_origins=tuple(allow_origins or ()),
                              allow_hosts=tuple(allow_hosts or ()))  # fmt: skip
                group.start_soon(serve_metrics_at, metrics_listen, checks, "mcp-proxy")
            await _run(gateway, keys, transport, host, port, allow_origins, allow_hosts,
                       session_idle_s, max_sessions)  # fmt: skip
            group.cancel_scope.cancel()
    finally:
        log.detach()
        if telemetry is not None:
            telemetry.shutdown()


async def watch_gateway(harness: Harness, config: Path, allow_imports: bool) -> None:
    """``--watch`` on a gateway: its ``plugins`` reloaded when the file changes; its
    servers are the ones it started with (said, when the file names others)."""
    from guardstack.cli.check import check
    from guardstack.cli.watch import watch_file
    from guardstack.gateway.mcp_gateway import read_gateway

    started = read_gateway(config).names()

    def reload(path: Path) -> list[str]:
        described = read_gateway(path)
        try:
            reloaded = harness.reload(
                list(described.plugins), allow_imports=allow_imports, check=check
            )
        except ConfigError as error:
            raise ConfigError(f"{path}: plugins: {error}", key=error.key) from error
        plugins = ", ".join(reloaded.plugins) or "no plugins"
        lines = [f"{path} reloaded: stack version {reloaded.version} ({plugins})"]
        if described.names() != started:
            lines.append("warning: the servers changed: restart the gateway to serve them")
        return lines

    await watch_file(config, reload)


async def _run(
    gateway: Any,
    keys: Path | None,
    transport: str,
    host: str,
    port: int,
    allow_origins: list[str] | None,
    allow_hosts: list[str] | None,
    session_idle_s: float,
    max_sessions: int,
) -> None:
    async with anyio.create_task_group() as group:
        await group.start(lambda task_status: gateway.run(task_status=task_status))
        if transport == "http":
            await _serve_http(
                gateway,
                Gate(
                    host,
                    keys=_key_tenants(gateway),
                    allow_origins=tuple(allow_origins or ()),
                    allow_hosts=tuple(allow_hosts or ()),
                ),
                port,
                session_idle_s,
                max_sessions,
            )
        else:
            await _serve_stdio(gateway)
        group.cancel_scope.cancel()


def _key_tenants(gateway: Any) -> dict[str, str] | None:
    return dict(gateway.keys.keys) if gateway.keys is not None else None


async def _serve_stdio(gateway: Any) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        try:
            await gateway.serve_stdio(read, write)
        finally:
            await write.aclose()


async def _serve_http(
    gateway: Any, gate: Gate, port: int, session_idle_s: float, max_sessions: int
) -> None:
    import uvicorn

    app = gateway.http_app(gate, session_idle_s=session_idle_s, max_sessions=max_sessions)
    host = gate.listen_host
    serving = f"guardstack mcp-proxy: gateway serving http://{host}:{port}/mcp"
    print(serving, file=sys.stderr, flush=True)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    )
    await serve(server)
