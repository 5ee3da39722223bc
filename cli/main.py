"""The ``guardstack`` command: ``demo``, ``describe``, ``check``, ``transcript``, ``replay``,
``mcp-proxy``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import attrs

from guardstack.cli.parsing import add_model_proxy_parser, allow_imports_option
from guardstack.pipeline.errors import ConfigError, GuardstackError
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.session import Session
from guardstack.pipeline.values import message_of

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="guardstack", description="Guards and wrappers for AI-agent tool calls."
    )
    from guardstack.pipeline.signals import VERSION

    parser.add_argument("--version", action="version", version=f"guardstack {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the demo: order semantics, guards, tracing")
    demo.add_argument("--save", type=Path, help="save the demo agent's session log here")
    demo.add_argument(
        "--otlp",
        metavar="URL",
        help="also send every span over OTLP/HTTP, e.g. http://localhost:4318 "
        "(needs guardstack[otlp])",
    )
    describe = commands.add_parser("describe", help="load a plugin config and print the onion")
    describe.add_argument("config", type=Path, help="a YAML, TOML or JSON plugin list")
    allow_imports_option(describe)
    transcript = commands.add_parser(
        "transcript", help="print the model request a saved session rebuilds"
    )
    transcript.add_argument("session", type=Path, help="a session saved as JSON Lines")
    check = commands.add_parser(
        "check", help="what a plugin config means layer by layer, and likely mistakes"
    )
    check.add_argument(
        "config",
        type=Path,
        nargs="?",
        help="a YAML, TOML or JSON plugin list, or an MCP gateway's file",
    )
    check.add_argument("--strict", action="store_true", help="exit 1 when there is a warning")
    check.add_argument(
        "--tenants",
        "--keys",
        dest="keys",
        type=Path,
        metavar="FILE",
        help="a tenants file (or an MCP gateway's keys file), checked and shown as a tree",
    )
    check.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="the model proxy's upstreams, as model-proxy takes them: with --route, the "
        "routes are checked and printed",
    )
    check.add_argument(
        "--route", action="append", default=[], metavar="SELECTOR=NAME", help="as model-proxy"
    )
    allow_imports_option(check)
    compare = commands.add_parser(
        "compare",
        help="run stacks side by side on the same seeded faults, in virtual time "
        "(needs guardstack[compare])",
    )
    compare.add_argument("configs", type=Path, nargs="+", help="plugin lists to compare")
    compare.add_argument("--scenario", type=Path, required=True, help="tools and their faults")
    compare.add_argument("--seed", type=int, default=0, help="the same seed, the same numbers")
    compare.add_argument("--calls", type=int, help="calls per stack (default: the scenario's)")
    compare.add_argument("--json", action="store_true", help="print JSON for machines")
    compare.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw the latency distributions and success rates (needs guardstack[plot])",
    )
    allow_imports_option(compare)
    replay = commands.add_parser(
        "replay", help="run a saved session's tool calls through guards: where would they fire?"
    )
    replay.add_argument("session", type=Path, help="a session saved as JSON Lines")
    replay.add_argument("--config", type=Path, required=True, help="the plugin list to try")
    allow_imports_option(replay)
    replay.add_argument("--json", action="store_true", help="print JSON for machines")
    proxy = commands.add_parser(
        "mcp-proxy",
        help="serve an MCP server's tools through a guard stack (needs guardstack[mcp])",
        description="Start COMMAND as an MCP server over stdio and serve its tools on this "
        "process's stdin/stdout, every call through the plugins of --config. A --config "
        "that lists servers ({servers: ..., plugins: [...]}) runs a gateway in front of "
        "all of them instead (docs/mcp-gateway.md).",
    )
    proxy.add_argument(
        "--config",
        type=Path,
        help="a YAML, TOML or JSON plugin list, or a gateway's {servers, plugins}",
    )
    allow_imports_option(proxy)
    proxy.add_argument(
        "--timeout",
        action="append",
        default=[],
        metavar="PATTERN=MS",
        help="a budget for the tools matching PATTERN ('*' wildcards); repeat for more",
    )
    proxy.add_argument("--default-timeout", metavar="MS", help="the budget of every other tool")
    proxy.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="how clients reach the proxy: this process's stdin/stdout (default), or "
        "streamable HTTP at http://LISTEN/mcp",
    )
    proxy.add_argument(
        "--listen",
        default="127.0.0.1:8808",
        metavar="HOST:PORT",
        help="where --transport http listens (default 127.0.0.1:8808: loopback only)",
    )
    proxy.add_argument(
        "--connect",
        metavar="URL",
        help="the downstream MCP server over streamable HTTP, instead of a command",
    )
    proxy.add_argument(
        "--tenants",
        "--keys",
        dest="keys",
        type=Path,
        metavar="FILE",
        help="a gateway's tenants file: client keys and what each tenant sees "
        "(docs/team-budgets.md; needs --transport http)",
    )
    proxy.add_argument(
        "--store",
        metavar="SPEC",
        help="a gateway's store for quotas: memory, sqlite:PATH or redis://... "
        "(default: sqlite at $XDG_STATE_HOME/guardstack/ledger.sqlite3)",
    )
    proxy.add_argument(
        "--decision-log",
        default="-",
        metavar="FILE|-|off",
        help="where a gateway writes each denial, refusal and admin action (default -)",
    )
    proxy.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="a gateway's metrics in Prometheus' text format at GET /metrics there "
        "(needs guardstack[prometheus])",
    )
    proxy.add_argument(
        "--watch",
        action="store_true",
        help="reload the plugins when --config changes (a gateway's servers are read at "
        "start; a file that does not load changes nothing)",
    )
    proxy.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin that may call the proxy over HTTP; none by default",
    )
    proxy.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name the proxy answers besides its listen address and loopback",
    )
    proxy.add_argument(
        "--session-idle-s",
        type=float,
        default=600.0,
        metavar="S",
        help="over HTTP, end a client session idle this long (600)",
    )
    proxy.add_argument(
        "--max-sessions",
        type=int,
        default=500,
        metavar="N",
        help="over HTTP, at most this many client sessions at once (500)",
    )
    proxy.add_argument(
        "server", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]: the MCP server to start"
    )
    add_model_proxy_parser(commands)
    spend = commands.add_parser(
        "spend",
        help="who spent what: a gateway's spend report, read from its store",
        description="The spend report GET /admin/spend answers, read from the store the "
        "gateways count in (no gateway needs to run).",
    )
    spend.add_argument("--store", metavar="SPEC", help="memory, sqlite:PATH or redis://... "
                       "(default: the gateways' default SQLite file)")  # fmt: skip
    spend.add_argument(
        "--scope", help="tenant:NAME, team:TENANT/TEAM, key:TENANT/NAME or model:NAME"
    )
    spend.add_argument("--window", choices=("day", "month"), default="day")
    spend.add_argument("--by", choices=("tenant", "team", "key", "model", "conversation"))
    spend.add_argument("--format", choices=("table", "json", "csv"), default="table")
    spend.add_argument(
        "--tenants",
        type=Path,
        metavar="FILE",
        help="the tenants file: each row's limit and share used, and the scope checked",
    )
    serve = commands.add_parser(
        "worker",
        help="run a Temporal worker for agents (needs guardstack[temporal])",
        description="Serve the agents made by each AGENT (module:function, called with no "
        "arguments, returning a TemporalAgent: your own code, imported on purpose) on a "
        "Temporal task queue until interrupted.",
    )
    serve.add_argument("agents", nargs="+", metavar="AGENT", help="module:function")
    serve.add_argument("--task-queue", required=True)
    serve.add_argument("--address", default="localhost:7233", help="the Temporal frontend")
    serve.add_argument("--namespace", default="default")
    serve.add_argument(
        "--sticky-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds before a lost worker's workflows move to another (Temporal's default: 10)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; bad input is a one-line error and exit code 2, never a traceback."""
    arguments = _parser().parse_args(argv)
    try:
        return _run(arguments)
    except BrokenPipeError:
        # The reader went away (``guardstack transcript s.jsonl | head``): not an error.
        # Point stdout at devnull so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (GuardstackError, OSError, UnicodeError) as error:
        print(f"guardstack: {message_of(error)}", file=sys.stderr)
        return 2


def _run(arguments: argparse.Namespace) -> int:
    if arguments.command == "demo":
        from guardstack.cli.demo import run_demo

        endpoint = arguments.otlp
        if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        anyio.run(lambda: run_demo(sys.stdout, save_to=arguments.save, otlp_endpoint=endpoint))
    elif arguments.command == "mcp-proxy":
        from guardstack.cli.mcp_proxy import parse_ms, parse_timeouts, run_proxy

        server = arguments.server[1:] if arguments.server[:1] == ["--"] else arguments.server
        timeouts = parse_timeouts(arguments.timeout)
        default = arguments.default_timeout
        default_timeout = None if default is None else parse_ms("--default-timeout", default)
        anyio.run(
            lambda: run_proxy(
                arguments.config,
                server,
                allow_imports=arguments.allow_imports,
                timeouts_ms=timeouts,
                default_timeout_ms=default_timeout,
                transport=arguments.transport,
                listen=arguments.listen,
                connect=arguments.connect,
                keys=arguments.keys,
                allow_origins=arguments.allow_origin,
                allow_hosts=arguments.allow_host,
                session_idle_s=arguments.session_idle_s,
                max_sessions=arguments.max_sessions,
                store=arguments.store,
                decision_log=arguments.decision_log,
                watch=arguments.watch,
                metrics_listen=arguments.metrics_listen,
            )
        )
    elif arguments.command == "model-proxy":
        from guardstack.cli.model_proxy import event_loop_options, run_model_proxy

        loop_options = event_loop_options(arguments.loop)
        anyio.run(
            lambda: run_model_proxy(
                arguments.config,
                arguments.upstream,
                key_env=arguments.upstream_key_env,
                keys=arguments.tenants,
                store=arguments.store,
                decision_log=arguments.decision_log,
                stop_as=arguments.stop_as,
                listen=arguments.listen,
                allow_imports=arguments.allow_imports,
                allow_origins=arguments.allow_origin,
                allow_hosts=arguments.allow_host,
                drain_ms=arguments.drain_ms,
                conversation_idle_ms=_idle_ms(arguments),
                max_conversations=arguments.max_conversations,
                max_body_bytes=arguments.max_body_bytes,
                admin_key_env=arguments.admin_key_env,
                watch=arguments.watch,
                routes=arguments.route,
                request_log=arguments.request_log,
                metrics_listen=arguments.metrics_listen,
                http=arguments.http,
                upstream_client=arguments.upstream_client,
            ),
            backend_options=loop_options,
        )
    elif arguments.command == "spend":
        from guardstack.cli.spend import render as render_spend
        from guardstack.cli.spend import spend

        spent = anyio.run(
            lambda: spend(
                arguments.store,
                arguments.scope,
                arguments.window,
                arguments.by,
                arguments.tenants,
            )
        )
        _print(render_spend(spent, arguments.format))
    elif arguments.command == "check":
        from guardstack.cli.check import check, check_tenants
        from guardstack.gateway.mcp_gateway.config import is_gateway_config

        if arguments.upstream or arguments.route:
            from guardstack.cli.check import check_routes

            _print("\n".join(check_routes(arguments.upstream, arguments.route)))
            if arguments.config is None and arguments.keys is None:
                return 0
        if arguments.config is None:
            if arguments.keys is None:
                raise ConfigError("check: give a configuration, --tenants FILE, or both")
            tree = check_tenants(arguments.keys)
            _print(tree.render())
            return 1 if arguments.strict and tree.warnings else 0
        if is_gateway_config(arguments.config):  # an MCP gateway: its servers, then its stack
            from guardstack.cli.mcp_gateway import load_gateway

            gateway, harness = load_gateway(
                arguments.config, arguments.keys, allow_imports=arguments.allow_imports
            )
            _print(gateway.describe_servers())
        else:
            harness = Harness()
            harness.load(arguments.config, allow_imports=arguments.allow_imports)
            if arguments.keys is not None:
                _print(check_tenants(arguments.keys).render())
        checked = check(harness)
        if callable(getattr(harness.store, "persistence", None)):  # a Redis: does it keep?
            from guardstack.cli.stores import forgets

            lost = anyio.run(forgets, harness.store)
            if lost is not None:
                checked = attrs.evolve(checked, warnings=(*checked.warnings, lost))
        _print(checked.render())
        if arguments.strict and checked.warnings:
            return 1
    elif arguments.command == "compare":
        from guardstack.cli.compare import compare as run_compare
        from guardstack.cli.compare import load_scenario
        from guardstack.cli.compare import render as render_table

        scenario = load_scenario(str(arguments.scenario))
        for config in arguments.configs:  # every file is read and checked before anything runs
            Harness().load(config, allow_imports=arguments.allow_imports)

        def builder(config: Path) -> Callable[[], Harness]:
            def build() -> Harness:
                harness = Harness()
                harness.load(config, allow_imports=arguments.allow_imports)
                return harness

            return build

        results = run_compare(
            [(config.name, builder(config)) for config in arguments.configs],
            scenario,
            seed=arguments.seed,
            calls=arguments.calls,
            progress=not arguments.json and sys.stderr.isatty(),
        )
        if arguments.plot is not None:
            from guardstack.cli.compare import plot, scenario_budgets

            plot(
                results,
                str(arguments.plot),
                title=f"{arguments.scenario.name}, seed {arguments.seed}, "
                f"{arguments.calls or scenario.calls:,} calls per stack",
                budgets_ms=scenario_budgets(scenario),
            )
        if arguments.json:
            _print(json.dumps({"stacks": [stats.to_dict() for stats in results]}, indent=2))
        else:
            _print(render_table(results))
    elif arguments.command == "replay":
        from guardstack.cli.replay import render, replay

        session = Session.load(arguments.session)
        harness = Harness()
        harness.load(arguments.config, allow_imports=arguments.allow_imports)
        report = anyio.run(replay, session, harness)
        _print(json.dumps(report.to_dict(), indent=2) if arguments.json else render(report))
    elif arguments.command == "worker":
        from guardstack.integrations.temporal import serve

        asyncio.run(
            serve(
                arguments.agents,
                arguments.task_queue,
                address=arguments.address,
                namespace=arguments.namespace,
                sticky_timeout_s=arguments.sticky_timeout,
            )
        )
    elif arguments.command == "describe":
        harness = Harness()
        harness.load(arguments.config, allow_imports=arguments.allow_imports)
        _print(harness.describe())
    else:
        session = Session.load(arguments.session)
        _print(json.dumps(session.messages(), ensure_ascii=False, indent=2))
    sys.stdout.flush()
    return 0


def _print(text: str) -> None:
    """Print ``text``; characters the terminal cannot encode (half a surrogate pair) escaped."""
    encoding = sys.stdout.encoding or "utf-8"
    sys.stdout.write(text.encode(encoding, "backslashreplace").decode(encoding) + "\n")


def _idle_ms(arguments: argparse.Namespace) -> float:
    """``--conversation-idle-ms``, or the deprecated ``--conversation-idle-s`` converted
    (said once on stderr: a CLI user never sees a ``DeprecationWarning``)."""
    seconds = arguments.conversation_idle_s
    if seconds is None:
        milliseconds: float = arguments.conversation_idle_ms
        return milliseconds
    print(
        "guardstack model-proxy: --conversation-idle-s is deprecated and removed in 0.3; "
        f"write --conversation-idle-ms {seconds * 1000:g}",
        file=sys.stderr,
    )
    return float(seconds) * 1000


if __name__ == "__main__":
    raise SystemExit(main())
