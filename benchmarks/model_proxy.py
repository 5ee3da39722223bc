"""What ``guardstack model-proxy`` adds to a request: the same upstream, called directly,
through guardstack's proxy and (where it installs) through LiteLLM's proxy, in one run.

Every side is its own process, as it would be in use: the upstream (a minimal
OpenAI-compatible server, starlette on uvicorn, loopback, answering at once — a JSON
completion or a three-chunk SSE stream — so what is measured is the hop and the
proxy's own work, not a model); ``guardstack model-proxy`` with the stack a user
would run (a model-stage ``Retry``, ``ToolCallLimit``, ``RepeatToolReminder``, a
``UsageLimit`` with a day's token budget); LiteLLM's proxy with ``num_retries: 3``.
LiteLLM's budgets need its database (Postgres), so it runs with retries only: it does
less per request than guardstack's side here. The measuring client is ``httpx`` (one
keep-alive pool per side) at one client and aiohttp at 100 (where httpx's own pool
becomes what is measured), in this process.

A fourth side is the floor: a bare forwarder (the body sent on, the answer
sent back, no guards), so the table shows the extra HTTP hop apart from the proxy's own
work (guardstack − forwarder). A fifth, ``budgets``, is guardstack's proxy with the same
stack behind a tenants file: every request reserved in four nested scopes (tenant, team,
key, conversation) and settled, on a SQLite ledger — the team-budgets deployment. Both
guardstack sides keep their counts in the default SQLite file (the decision log, on
standard error by default, goes to ``/dev/null`` here).

* non-streaming: wall time per request at 1 client (one after another) and at 100
  concurrent clients (and the throughput there, against the forwarder's);
* streaming: time to the first byte of the stream, at 1 client;
* memory: the proxy process's resident set before and after ``--conversations``
  (100,000) requests, each in a conversation of its own (freed past
  ``--max-conversations``, its caps' counts kept in the ledger).

Rounds are interleaved (direct, guardstack, LiteLLM, direct, …); the first round is
warm-up; each figure is the median of the rounds' medians, with their range.

    python -m benchmarks.model_proxy [--requests 300] [--rounds 3]
        [--litellm /path/to/venv/bin/litellm] [--stack fast|plain] [--client aiohttp|httpx]

``--stack`` is the HTTP stack every side of ours runs on (the upstream, the forwarder
and both proxies alike, so the comparison stays fair): ``plain`` (the default, what
``guardstack model-proxy`` runs on: asyncio's own loop with h11) or ``fast`` (uvicorn
on uvloop with httptools) — how the stack was chosen. ``--client`` is the HTTP client
the forwarder and guardstack's sides reach the upstream with (``aiohttp``, the default
``guardstack model-proxy`` picks on asyncio, or ``httpx``): how the client was chosen.

``--litellm`` (or ``$LITELLM``) is the ``litellm`` command of an environment with
``litellm[proxy]`` installed; it is kept out of this project's own environment
because it pins versions of FastAPI, uvicorn and friends of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).parents[1]
COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
CHUNKS = [
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"o"}}]}\n\n',
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"k"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
GUARDS = """\
- name: retry
  config: {stage: model, attempts: 3}
- name: tool-call-limit
  config: {per_turn: 40}
- name: repeat-tool-reminder
- name: usage-limit
  config: {tokens_per_day: 1000000000}
"""
#: The budgets side: the same stack behind a tenants file, every request reserved in four
#: nested scopes (tenant, team, key, conversation) on the default store (SQLite).
TENANTS = """\
keys:
  sk-bench-0123456789abcdef: {tenant: acme, team: ci, name: ci}
tenants:
  acme:
    budget: {usd_per_day: 1000000}
    teams: {ci: {budget: {usd_per_day: 1000000}}}
defaults:
  key: {budget: {usd_per_day: 1000000}}
  conversation: {budget: {usd: 1000000}}
prices: {m: [1, 2]}
"""
LITELLM_CONFIG = """\
model_list:
  - model_name: m
    litellm_params:
      model: openai/m
      api_base: http://127.0.0.1:{port}/v1
      api_key: upstream-key
litellm_settings:
  num_retries: 3
  telemetry: false
"""


def upstream_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    async def chat(request: Request) -> Response:
        data = json.loads(await request.body())
        if data.get("stream"):
            gap_s = float(data.get("gap_ms", 0)) / 1000
            count = int(data.get("chunks", 0))

            async def events() -> AsyncIterator[bytes]:
                if count:  # a model writing as it thinks: a chunk every gap_s
                    for _ in range(count):
                        yield CHUNKS[0]
                        await anyio.sleep(gap_s)
                    yield CHUNKS[1]
                    yield CHUNKS[2]
                    return
                for chunk in CHUNKS:
                    yield chunk

            return StreamingResponse(events(), media_type="text/event-stream")
        return Response(COMPLETION, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user and system), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _stream_gaps(url: str, key: str, streams: int, chunks: int, gap_ms: float) -> list[float]:
    """Every gap between two chunks a client sees, in ms, across ``streams`` streams at
    once, each ``chunks`` chunks ``gap_ms`` apart at the upstream (read with aiohttp:
    httpx's pool, at 512 streams, was itself the stall measured)."""
    import aiohttp

    body = {**BODY, "stream": True, "chunks": chunks, "gap_ms": gap_ms}
    gaps: list[float] = []
    headers = {"authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:

        async def one() -> None:
            async with session.post(
                f"{url}/v1/chat/completions", json=body, headers=headers
            ) as response:
                response.raise_for_status()
                last = None
                async for _ in response.content.iter_any():
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append((now - last) * 1000)
                    last = now

        async with anyio.create_task_group() as group:
            for _ in range(streams):
                group.start_soon(one)
    return gaps


def forwarder_app(upstream: str, client_name: str = "") -> Any:
    """The floor a proxy cannot go under: the body forwarded to the upstream and the
    answer (or stream) sent back — the same HTTP hop, no guards — with the HTTP client
    guardstack's side uses (``--client``)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    headers = {"content-type": "application/json", "authorization": "Bearer k"}
    client = httpx.AsyncClient(base_url=upstream, timeout=None)
    sessions: list[Any] = []  # aiohttp's, made on the server's event loop

    async def send(body: bytes) -> tuple[int, AsyncIterator[bytes], Any]:
        """The upstream's status, its body as it arrives, and what closes it."""
        if client_name != "aiohttp":
            sent = client.build_request(
                "POST", "/v1/chat/completions", content=body, headers=headers
            )
            answer = await client.send(sent, stream=True)
            return answer.status_code, answer.aiter_raw(), answer.aclose
        import aiohttp

        if not sessions:
            sessions.append(aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None),
                connector=aiohttp.TCPConnector(limit=1_000),
            ))  # fmt: skip
        response = await sessions[0].post(
            upstream + "/v1/chat/completions", data=body, headers=headers
        )

        async def release() -> None:
            response.release()

        return response.status, response.content.iter_any(), release

    async def chat(request: Request) -> Response:
        body = await request.body()
        status, content, close = await send(body)
        if json.loads(body).get("stream"):

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in content:
                        yield chunk
                finally:
                    await close()

            return StreamingResponse(relay(), media_type="text/event-stream")
        try:
            whole = b"".join([chunk async for chunk in content])
        finally:
            await close()
        return Response(whole, status, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _port() -> int:
    from tests.integrations.ports import free_port

    return free_port()


async def _until_answering(port: int, process: Any, what: str) -> None:
    """Until ``port`` answers HTTP (any status), or say why not."""
    with anyio.fail_after(120):
        async with httpx.AsyncClient() as probe:
            while True:
                if process.returncode is not None:
                    raise SystemExit(f"{what} exited ({process.returncode}) before it listened")
                try:
                    await probe.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                except httpx.HTTPError:
                    await anyio.sleep(0.1)
                else:
                    return


async def _timed(
    client: httpx.AsyncClient, requests: int, concurrent: int, stream: bool, side: str = ""
) -> list[float]:
    """Seconds per request (or to the first byte of a stream)."""
    body = {**BODY, "stream": True} if stream else BODY
    times: list[float] = []
    left = iter(range(requests))

    async def one() -> None:
        started = time.perf_counter()
        if stream:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                first = True
                async for _ in response.aiter_raw():
                    if first:
                        times.append(time.perf_counter() - started)
                        first = False
        else:
            try:
                await _post(client, body)
            except httpx.HTTPError:  # counted, by side: a failed request has no time
                FAILED[side] = FAILED.get(side, 0) + 1
                return
            times.append(time.perf_counter() - started)

    async def caller() -> None:
        for _ in left:
            await one()

    async with anyio.create_task_group() as callers:
        for _ in range(concurrent):
            callers.start_soon(caller)
    return times


async def _timed_many(url: str, key: str, requests: int, concurrent: int, side: str) -> list[float]:
    """``requests`` JSON requests from ``concurrent`` callers at once, each timed, sent with
    aiohttp: at 100 callers httpx's connection pool spent 5.8 ms of the measuring
    process's CPU a request (0.9 ms at 10) and became what was measured — each side's
    figure said more about the client than about the side."""
    import aiohttp

    times: list[float] = []
    left = iter(range(requests))
    headers = {"authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=concurrent * 2)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def caller() -> None:
            for _ in left:
                started = time.perf_counter()
                try:
                    async with session.post(
                        f"{url}/v1/chat/completions", json=BODY, headers=headers
                    ) as answer:
                        await answer.read()
                        answer.raise_for_status()
                except aiohttp.ClientError:  # counted, by side: a failure has no time
                    FAILED[side] = FAILED.get(side, 0) + 1
                    continue
                times.append(time.perf_counter() - started)

        async with anyio.create_task_group() as callers:
            for _ in range(concurrent):
                callers.start_soon(caller)
    return times


#: The HTTP stacks compared (``--stack``): uvicorn's event loop and HTTP parser.
STACKS = {"fast": {"loop": "uvloop", "http": "httptools"},
          "plain": {"loop": "asyncio", "http": "h11"}}  # fmt: skip

CASES = {
    "1 client": (1, 1, False),
    "100 clients": (3, 100, False),
    "stream, first byte": (1, 1, True),
}


#: Requests sent again because a kept-alive connection was closed under them.
RESENT = [0]
#: Requests that failed (an error status, a dropped connection twice), by side.
FAILED: dict[str, int] = {}


async def _post(
    client: httpx.AsyncClient, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    """One POST; sent once more when the server had just closed the kept-alive connection
    it went out on (uvicorn closes idle ones after 5 s: a race in every HTTP client, on
    every side alike — counted and reported, never hidden)."""
    for attempt in range(2):
        try:
            answer = await client.post("/v1/chat/completions", json=body, headers=headers)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            if attempt:
                raise
            RESENT[0] += 1
            continue
        answer.raise_for_status()
        return answer
    raise AssertionError("unreachable")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _conversations(port: int, count: int) -> None:
    """``count`` requests, each in a new conversation, 50 at a time."""
    left = iter(range(count))
    limits = httpx.Limits(max_connections=60, max_keepalive_connections=60)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=60
    ) as client:

        async def caller() -> None:
            for number in left:
                headers = {"x-guardstack-conversation": f"conversation-{number}"}
                await _post(client, BODY, headers)

        async with anyio.create_task_group() as callers:
            for _ in range(50):
                callers.start_soon(caller)


async def measure(
    requests: int,
    rounds: int,
    litellm: str | None,
    conversations: int = 0,
    stack: str = "plain",
    upstream_client: str = "aiohttp",
) -> dict[str, dict[str, list[float]]]:
    """Per case and side, each kept round's median in milliseconds."""
    upstream_port, forwarder_port, proxy_port, litellm_port = _port(), _port(), _port(), _port()
    work = Path(tempfile.mkdtemp(prefix="guardstack-bench-"))
    (work / "guards.yaml").write_text(GUARDS, "utf-8")
    (work / "tenants.yaml").write_text(TENANTS, "utf-8")
    budgets_port = _port()
    (work / "litellm.yaml").write_text(LITELLM_CONFIG.format(port=upstream_port), "utf-8")
    python = sys.executable
    chosen = STACKS[stack]
    ours = [
        "--loop",
        chosen["loop"],
        "--http",
        chosen["http"],
        "--upstream-client",
        upstream_client,
    ]
    commands = {
        "upstream": [python, "-m", "benchmarks.model_proxy", "--serve-upstream",
                     str(upstream_port)],
        "forwarder": [python, "-m", "benchmarks.model_proxy", "--serve-forwarder",
                      str(forwarder_port), f"http://127.0.0.1:{upstream_port}"],
        "guardstack": [python, "-c", "from guardstack.cli.main import main; main()",
                       "model-proxy", "--config", str(work / "guards.yaml"), "--upstream",
                       f"http://127.0.0.1:{upstream_port}", "--listen",
                       f"127.0.0.1:{proxy_port}", *ours],
        "budgets": [python, "-c", "from guardstack.cli.main import main; main()",
                    "model-proxy", "--config", str(work / "guards.yaml"), "--upstream",
                    f"http://127.0.0.1:{upstream_port}", "--tenants", str(work / "tenants.yaml"),
                    "--store", f"sqlite:{work / 'ledger.sqlite3'}",
                    "--listen", f"127.0.0.1:{budgets_port}", *ours],
    }  # fmt: skip
    if litellm:
        commands["litellm"] = [litellm, "--config", str(work / "litellm.yaml"), "--port",
                               str(litellm_port), "--host", "127.0.0.1"]  # fmt: skip
    ports = {
        "upstream": upstream_port,
        "forwarder": forwarder_port,
        "guardstack": proxy_port,
        "budgets": budgets_port,
        "litellm": litellm_port,
    }
    master = "sk-" + "5f" * 32  # LiteLLM's proxy refuses to start without a strong one
    # XDG_STATE_HOME: the proxies' default ledger is this run's own
    environment = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": master,
                   "XDG_STATE_HOME": str(work), "BENCH_STACK": stack,
                   "BENCH_CLIENT": upstream_client}  # fmt: skip
    processes: list[Any] = []
    results: dict[str, dict[str, list[float]]] = {case: {} for case in CASES}
    try:
        for name, command in commands.items():
            process = await anyio.open_process(
                command, cwd=str(ROOT), env=environment, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            processes.append(process)
            await _until_answering(ports[name], process, name)
        sides = {"direct": upstream_port, "forwarder": forwarder_port, "guardstack": proxy_port,
                 "budgets": budgets_port}  # fmt: skip
        if litellm:
            sides["litellm"] = litellm_port
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        keys = {"direct": "k", "forwarder": "k", "guardstack": "client-key",
                "budgets": "sk-bench-0123456789abcdef", "litellm": master}  # fmt: skip
        for case, (scale, concurrent, stream) in CASES.items() if rounds else ():
            for round_ in range(rounds + 1):
                for side, port in sides.items():
                    if concurrent > 1:  # httpx's own pool is what 100 callers would measure
                        times = await _timed_many(
                            f"http://127.0.0.1:{port}", keys[side], requests * scale,
                            concurrent, side,
                        )  # fmt: skip
                    else:
                        async with httpx.AsyncClient(
                            base_url=f"http://127.0.0.1:{port}",
                            limits=limits,
                            timeout=60,
                            headers={"authorization": f"Bearer {keys[side]}"},
                        ) as client:
                            times = await _timed(client, requests * scale, 1, stream, side)
                    if round_:  # the first is warm-up
                        results[case].setdefault(side, []).append(statistics.median(times) * 1e3)
                        if concurrent > 1:  # and the throughput, requests a second
                            results.setdefault("throughput", {}).setdefault(side, []).append(
                                len(times) / (sum(times) / concurrent)
                            )
        if rounds:
            # CPU per request: each proxy process's CPU seconds over 1,000 requests
            pids = {"forwarder": processes[1].pid, "guardstack": processes[2].pid,
                    "budgets": processes[3].pid}  # fmt: skip
            for side, pid in pids.items():
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{sides[side]}", limits=limits, timeout=60,
                    headers={"authorization": f"Bearer {keys[side]}"},
                ) as client:  # fmt: skip
                    before_cpu = _cpu_s(pid)
                    await _timed(client, 1_000, 4, False, side)
                    spent = _cpu_s(pid) - before_cpu
                results.setdefault("cpu_us", {})[side] = [spent / 1_000 * 1e6]
            # 512 streams at once, a chunk every 20 ms: what each side adds to the gaps
            for side in ("direct", "forwarder", "guardstack"):
                gaps = await _stream_gaps(
                    f"http://127.0.0.1:{sides[side]}", keys[side], 512, 20, 20.0
                )
                results.setdefault("stream_gaps", {})[side] = gaps
        if conversations:
            pid = processes[2].pid  # the guardstack proxy
            # past the proxy's bound on conversations (10,000) first: from then on each
            # new conversation frees the least recently used, and memory stays where it is
            await _conversations(proxy_port, 20_000)
            before = _rss_mb(pid)
            await _conversations(proxy_port, conversations)
            results["memory"] = {"before": [before], "after": [_rss_mb(pid)]}
    finally:
        for process in processes:
            if process.returncode is None:
                process.terminate()
            with anyio.move_on_after(10):
                await process.wait()
        shutil.rmtree(work, ignore_errors=True)
    return results


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--litellm", default=os.environ.get("LITELLM"))
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument(
        "--memory-only", action="store_true", help="skip the latency rounds (--rounds 0)"
    )
    parser.add_argument("--stack", choices=sorted(STACKS), default="plain")
    parser.add_argument(
        "--client", choices=("aiohttp", "httpx"), default="aiohttp",
        help="the HTTP client the forwarder and guardstack reach the upstream with",
    )  # fmt: skip
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-forwarder", nargs=2, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve_upstream or options.serve_forwarder:
        import uvicorn

        app, port = (
            (upstream_app(), options.serve_upstream)
            if options.serve_upstream
            else (
                forwarder_app(
                    options.serve_forwarder[1], os.environ.get("BENCH_CLIENT", "aiohttp")
                ),
                int(options.serve_forwarder[0]),
            )
        )
        chosen = STACKS[os.environ.get("BENCH_STACK", "plain")]
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                    loop=chosen["loop"], http=chosen["http"])  # fmt: skip
        return
    litellm = options.litellm or shutil.which("litellm")
    rounds = 0 if options.memory_only else options.rounds
    results = anyio.run(
        measure, options.requests, rounds, litellm, options.conversations, options.stack,
        options.client,
    )  # fmt: skip
    print(f"stack: {options.stack} ({STACKS[options.stack]['loop']}, "
          f"{STACKS[options.stack]['http']}); upstream client: {options.client}")  # fmt: skip
    memory = results.pop("memory", None)
    throughput = results.pop("throughput", {})
    cpu = results.pop("cpu_us", {})
    gaps = results.pop("stream_gaps", {})
    sides = ["forwarder", "guardstack", "budgets"] + (["litellm"] if litellm else [])
    print("| case | direct ms | " + " | ".join(f"{side} ms (added)" for side in sides) + " |")
    print("|------|-----------|" + "|".join("---" for _ in sides) + "|")
    for case, measured in results.items():
        if not measured:
            continue
        direct = statistics.median(measured["direct"])
        cells = []
        for side in sides:
            values = measured[side]
            middle = statistics.median(values)
            cells.append(
                f"{middle:.2f} (+{middle - direct:.2f}; {min(values):.2f}–{max(values):.2f})"
            )
        print(f"| {case} | {direct:.2f} | " + " | ".join(cells) + " |")
    if throughput:
        ratios = [
            mine / floor
            for mine, floor in zip(throughput["guardstack"], throughput["forwarder"], strict=True)
        ]
        print(
            f"\n100 clients: guardstack serves {statistics.median(ratios):.2f}x the forwarder's "
            f"requests a second ({min(ratios):.2f}–{max(ratios):.2f})"
        )
    if cpu:
        print("CPU per request (µs, 1,000 requests, 4 clients): " + ", ".join(
            f"{side} {values[0]:.0f}" for side, values in cpu.items()))  # fmt: skip
    if gaps:
        floor = _percentile(gaps["direct"], 99)
        p99 = {side: _percentile(values, 99) for side, values in gaps.items()}
        said = ", ".join(f"{side} {p:.2f} (added {p - floor:+.2f})" for side, p in p99.items())
        print(f"512 streams at once, a chunk every 20 ms: gap between chunks p99 (ms) {said}")
    if memory:
        print(
            f"memory over {options.conversations:,} conversations: "
            f"{memory['before'][0]:.1f} MB resident before, {memory['after'][0]:.1f} MB after"
        )
    print(f"requests sent again after a closed kept-alive connection: {RESENT[0]}")
    print(f"requests that failed, by side (left out of the times): {FAILED or 'none'}")
    if not litellm:
        print(
            "\nLiteLLM's proxy was not measured: give --litellm, the `litellm` command of an "
            "environment with litellm[proxy] installed."
        )


if __name__ == "__main__":
    main()
