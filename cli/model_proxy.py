"""``guardstack model-proxy``: an OpenAI-compatible API through an assembled guard stack.

    UPSTREAM_KEY=sk-… guardstack model-proxy --config guards.yaml \\
        --upstream https://api.openai.com --upstream-key-env UPSTREAM_KEY

then point the agent's base URL at ``http://127.0.0.1:8809/v1``. The configuration
is read, and the key looked up, before anything listens.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import anyio

from guardstack.cli.mcp_proxy import (
    _listen,
    export_from_environment,
    metrics_reader,
    serve_metrics_at,
)
from guardstack.cli.stores import describe_store, forgets, say, store_from
from guardstack.cli.watch import watch_config, watch_file
from guardstack.gateway.decision_log import DecisionLog
from guardstack.gateway.model_proxy import DEFAULT, ModelProxy
from guardstack.gateway.request_log import RequestLog
from guardstack.gateway.tenants import read_tenants
from guardstack.integrations._gate import serve
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.plugin_config import STORE_ENTRIES, in_file, read_entries
from guardstack.pipeline.store import StateStore


def named_options(values: list[str], option: str, *, default_required: bool) -> dict[str, str]:
    """``[NAME=]VALUE`` options: name -> value (the unnamed one under ``default``)."""
    named: dict[str, str] = {}
    for value in values:
        name, has_name, rest = value.partition("=")
        # A URL's own "=" (a query) is not a name: names come before "://".
        if not has_name or "://" in name or "/" in name:
            name, rest = DEFAULT, value
        if not name or not rest:
            raise ConfigError(
                f"model-proxy: {option} {value!r} must be [NAME=]VALUE", key=option, value=value
            )
        if name in named:
            raise ConfigError(
                f"model-proxy: {option} is given twice for {name!r}", key=option, value=value
            )
        named[name] = rest
    if default_required and DEFAULT not in named:
        raise ConfigError(
            f"model-proxy: {option} needs one unnamed URL (the default upstream)",
            key=option,
            value=values,
        )
    return named


def _store_for(spec: str | None, config: Path | None) -> StateStore | None:
    """The store the proxy keeps its counts in: ``--store``'s, else the configuration's
    own store entry's (``None`` here: the file sets it as it loads), else SQLite — a
    month's spend kept across restarts."""
    named = config is not None and any(
        entry.get("name") in STORE_ENTRIES for entry in read_entries(config)
    )
    if named:
        if spec is not None:
            raise ConfigError(
                f"model-proxy: --store {spec!r} and a store entry in {config}: give one",
                key="store",
                value=spec,
            )
        return None
    return store_from(spec)


def _admin_key(variable: str | None) -> str | None:
    """The admin key from the environment variable ``--admin-key-env`` names, if any."""
    if variable is None:
        return None
    key = os.environ.get(variable)
    if not key:
        raise ConfigError(
            f"the environment variable {variable!r} (--admin-key-env) is not set",
            key="admin-key-env",
            value=variable,
        )
    return key


async def run_model_proxy(
    config: Path | None,
    upstream: str | list[str],
    *,
    key_env: str | list[str] | None = None,
    keys: Path | None = None,
    store: str | None = None,
    decision_log: str = "-",
    stop_as: str = "answer",
    listen: str = "127.0.0.1:8809",
    allow_imports: bool = False,
    allow_origins: list[str] | None = None,
    allow_hosts: list[str] | None = None,
    drain_ms: int = 10_000,
    conversation_idle_ms: float = 3_600_000.0,
    max_conversations: int = 10_000,
    max_body_bytes: int = 4 * 1024 * 1024,
    admin_key_env: str | None = None,
    watch: bool = False,
    routes: list[str] | None = None,
    request_log: str = "off",
    metrics_listen: str | None = None,
    http: str = "h11",
    upstream_client: str = "auto",
) -> None:
    """Serve until stopped (``watch``: reload the stack when ``config`` changes)."""
    import uvicorn

    host, port = _listen(listen)
    route_list = list(routes or [])
    urls = named_options([upstream] if isinstance(upstream, str) else upstream, "--upstream",
                  default_required=not route_list)  # fmt: skip
    variables = named_options(
        [key_env] if isinstance(key_env, str) else list(key_env or []),
        "--upstream-key-env",
        default_required=False,
    )
    upstream_keys: dict[str, str] = {}
    for name, variable in variables.items():
        if name not in urls:
            raise ConfigError(
                f"model-proxy: --upstream-key-env names the upstream {name!r}, which no "
                "--upstream NAME=URL gives",
                key="upstream-key-env",
                value=name,
            )
        key = os.environ.get(variable)
        if not key:
            raise ConfigError(
                f"model-proxy: the environment variable {variable!r} (--upstream-key-env) is "
                "not set",
                key="upstream-key-env",
                value=variable,
            )
        upstream_keys[name] = key
    tenants = read_tenants(keys) if keys is not None else None
    admin_key = _admin_key(admin_key_env)
    # OTEL_EXPORTER_OTLP_ENDPOINT: a `tracing` layer's spans (and the metrics) go there;
    # set up before the stack is built, whose layers take the providers as they load;
    # --metrics-listen: the same metrics for a Prometheus to scrape
    scraped = metrics_reader(metrics_listen)
    telemetry = export_from_environment("guardstack-model-proxy", scraped)
    log = DecisionLog(decision_log).attach()
    requests = RequestLog(request_log)
    try:
        harness = Harness(store=_store_for(store, config))
        if config is not None:
            harness.load(config, allow_imports=allow_imports)
        say(f"guardstack model-proxy: counts kept in {describe_store(harness.store)}")
        lost = await forgets(harness.store)
        if lost is not None:
            say(f"guardstack model-proxy: warning: {lost}")
        try:
            proxy = ModelProxy(
                harness,
                urls.pop(DEFAULT, None),
                routes=route_list,
                upstream_key=upstream_keys.pop(DEFAULT, None),
                upstreams=urls,
                upstream_keys=upstream_keys,
                tenants=tenants,
                decision_log=log,
                stop_as=stop_as,
                listen_host=host,
                allow_origins=allow_origins or (),
                allow_hosts=allow_hosts or (),
                drain_ms=drain_ms,
                conversation_idle_ms=conversation_idle_ms,
                max_conversations=max_conversations,
                max_body_bytes=max_body_bytes,
                admin_key=admin_key,
                request_log=requests,
                upstream_client=upstream_client,
            )
        except ConfigError as error:  # a fallback naming an upstream nobody gave
            raise in_file(error, config) from error
        for line in proxy.describe_routes():
            say(f"guardstack model-proxy: route {line}")
        print(
            f"guardstack model-proxy: serving http://{host}:{port}/v1", file=sys.stderr, flush=True
        )
        try:
            server = uvicorn.Server(
                uvicorn.Config(proxy.app, host=host, port=port, log_level="warning", http=http)
            )
            async with anyio.create_task_group() as group:
                if watch and config is not None:
                    group.start_soon(
                        lambda: watch_config(
                            harness, config, allow_imports=allow_imports, after=proxy.reloaded
                        )
                    )
                if watch and keys is not None and proxy.budgets is not None:
                    group.start_soon(watch_tenants, proxy.budgets, keys)
                if metrics_listen is not None:
                    group.start_soon(serve_metrics_at, metrics_listen, proxy.gate, "model-proxy")
                await serve(server)
                group.cancel_scope.cancel()
        finally:
            await proxy.aclose()
    finally:
        log.detach()
        requests.close()
        if telemetry is not None:
            telemetry.shutdown()  # flush what the proxy traced


def event_loop_options(loop: str) -> dict[str, Any]:
    """anyio's asyncio options for ``--loop``: uvloop when asked, or when installed and
    ``auto`` (asyncio's own is the default, chosen by measurement:
    ``benchmarks.model_proxy --stack``, docs/speed.md)."""
    if loop == "asyncio":
        return {}
    if importlib.util.find_spec("uvloop") is None:
        if loop == "uvloop":
            raise ConfigError(
                "model-proxy: --loop uvloop needs uvloop: pip install uvloop",
                key="loop",
                value=loop,
            )
        return {}
    return {"use_uvloop": True}


async def watch_tenants(budgets: Any, path: Path) -> None:
    """``--watch``: serve the tenants file again whenever it changes (a file that does
    not load changes nothing)."""

    def reload(path: Path) -> list[str]:
        tenants = read_tenants(path)
        budgets.replace(tenants)
        keys, named = len(tenants.keys), len(tenants.tenants)
        counted = f"{keys} key{'s' * (keys != 1)}, {named} tenant{'s' * (named != 1)}"
        return [f"{path} reloaded: {counted}"]

    await watch_file(path, reload, what="who may spend what", empty="write `tenants: {}`")
