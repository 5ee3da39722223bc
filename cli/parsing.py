"""The command line's shared options, and the ``model-proxy`` command's (its longest):
argparse only, so that ``guardstack --help`` imports nothing of the gateways."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_model_proxy_parser", "allow_imports_option"]


def allow_imports_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--allow-imports",
        action="store_true",
        help="also accept module:attribute plugin names (runs that module's code: "
        "only for files you trust)",
    )


def add_model_proxy_parser(commands: Any) -> None:
    """The ``model-proxy`` command's options (``guardstack model-proxy --help``)."""
    model_proxy = commands.add_parser(
        "model-proxy",
        help="serve an OpenAI-compatible API through a guard stack (needs guardstack[proxy])",
        description="An HTTP server speaking OpenAI's chat completions "
        "(POST /v1/chat/completions), Anthropic's Messages (POST /v1/messages) and OpenAI's "
        "Responses (POST /v1/responses), Gemini (POST /v1beta/models/M:generateContent) and "
        "GET /v1/models, in front of every --upstream: each request routed to its upstream "
        "(--route) and through the model stage and the conversation's guards of --config.",
    )
    model_proxy.add_argument("--config", type=Path, help="a YAML, TOML or JSON plugin list")
    allow_imports_option(model_proxy)
    model_proxy.add_argument(
        "--upstream",
        required=True,
        action="append",
        metavar="[NAME=]URL",
        help="a provider's base URL: the unnamed one is the default; NAME=URL names one for "
        "--route and for a model-stage fallback (to: {upstream: NAME})",
    )
    model_proxy.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="SELECTOR=NAME",
        help="send what SELECTOR matches to the upstream NAME (repeatable, the first match "
        "wins): a wire (chat, responses, messages, gemini), a model glob (deepseek-*), or "
        "WIRE:GLOB; a request no route matches goes to the unnamed --upstream, or is 404",
    )
    model_proxy.add_argument(
        "--upstream-key-env",
        action="append",
        default=[],
        metavar="[NAME=]VAR",
        help="the environment variable holding an upstream's key (never logged); "
        "NAME=VAR for a named upstream",
    )
    model_proxy.add_argument(
        "--tenants",
        "--keys",
        dest="tenants",
        type=Path,
        metavar="FILE",
        help="the tenants file: client keys, tenants, teams, budgets, prices "
        "(docs/team-budgets.md; a {key: tenant} mapping too); else any client",
    )
    model_proxy.add_argument(
        "--store",
        metavar="SPEC",
        help="where counts and spend are kept: memory, sqlite:PATH or redis://... "
        "(default: sqlite at $XDG_STATE_HOME/guardstack/ledger.sqlite3, kept across restarts)",
    )
    model_proxy.add_argument(
        "--decision-log",
        default="-",
        metavar="FILE|-|off",
        help="where each stop, denial, refusal and admin action is written as a JSON line "
        "(default -: standard error)",
    )
    model_proxy.add_argument(
        "--request-log",
        default="off",
        metavar="FILE|-|off",
        help="one JSON line per request answered: who, model, wire, upstream, status, "
        "tokens, dollars, time — never a key or content (default off; -: standard output)",
    )
    model_proxy.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="the metrics in Prometheus' text format at GET /metrics there "
        "(needs guardstack[prometheus])",
    )
    model_proxy.add_argument(
        "--loop",
        choices=("asyncio", "uvloop", "auto"),
        default="asyncio",
        help="the event loop (default asyncio's own: uvloop measured no faster here, "
        "docs/speed.md; auto: uvloop when installed)",
    )
    model_proxy.add_argument(
        "--http",
        choices=("h11", "httptools", "auto"),
        default="h11",
        help="the HTTP parser (default h11; httptools measured no faster here)",
    )
    model_proxy.add_argument(
        "--upstream-client",
        choices=("auto", "aiohttp", "httpx"),
        default="auto",
        help="the HTTP client that reaches the upstreams (default auto: aiohttp, measured "
        "0.8 ms of CPU a request cheaper than httpx, docs/speed.md; httpx without it)",
    )
    model_proxy.add_argument(
        "--stop-as",
        choices=("answer", "error"),
        default="answer",
        help="a guard's stop as the assistant's answer (default) or as the API's error "
        "(429 for a budget or a limit, 400 otherwise)",
    )
    model_proxy.add_argument(
        "--watch",
        action="store_true",
        help="reload the stack when --config changes, and the keys and budgets when --tenants "
        "does (a file that does not load changes nothing)",
    )
    model_proxy.add_argument(
        "--admin-key-env",
        metavar="VAR",
        help="serve manual control at /admin/control, behind the key in this environment "
        "variable (16 characters or more)",
    )
    model_proxy.add_argument(
        "--listen",
        default="127.0.0.1:8809",
        metavar="HOST:PORT",
        help="where to listen (default 127.0.0.1:8809: loopback only)",
    )
    model_proxy.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin that may call the proxy (https://app.example); none by default",
    )
    model_proxy.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name the proxy answers besides its listen address and loopback",
    )
    model_proxy.add_argument(
        "--drain-ms",
        type=int,
        default=10_000,
        metavar="MS",
        help="how long to read on for a stream's usage after its client left (10000)",
    )
    model_proxy.add_argument(
        "--conversation-idle-ms",
        type=float,
        default=3_600_000.0,
        metavar="MS",
        help="free a conversation unused this long (3600000; its caps' counts are kept)",
    )
    model_proxy.add_argument(
        "--conversation-idle-s",
        type=float,
        default=None,
        metavar="S",
        help="deprecated (removed in 0.3): write --conversation-idle-ms",
    )
    model_proxy.add_argument(
        "--max-conversations",
        type=int,
        default=10_000,
        metavar="N",
        help="keep at most this many conversations, least recently used freed first",
    )
    model_proxy.add_argument(
        "--max-body-bytes",
        type=int,
        default=4 * 1024 * 1024,
        metavar="N",
        help="refuse a request body larger than this (4 MiB)",
    )
