"""What ``guardstack model-proxy`` adds to a request: the same upstream, called directly
and through the proxy, in the same run.

The upstream is a minimal OpenAI-compatible server (starlette on uvicorn, loopback)
that answers at once — a JSON completion, or a three-chunk SSE stream — so what is
measured is the hop and the proxy's own work, not a model. The proxy runs the stack
a user would: a model-stage ``Retry``, ``ToolCallLimit``, ``RepeatToolReminder``.
The client is ``httpx`` (one connection pool per side, keep-alive).

* non-streaming: wall time per request, median over the run, at 1 client (one after
  another) and at 100 concurrent clients;
* streaming: time to first byte of the stream, at 1 client.

Reported as the proxy's addition (through − direct) and the ratio. LiteLLM's proxy
is not compared here: it needs ``litellm[proxy]`` (FastAPI, a database for budgets),
which this project does not install.

    python -m benchmarks.model_proxy [--requests 300]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from guardstack.guards import RepeatToolReminder, ToolCallLimit
from guardstack.integrations.model_proxy import ModelProxy
from guardstack.pipeline import Harness
from guardstack.wrappers import Retry

COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
CHUNKS = [
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"o"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"k"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _upstream_chat(request: Request) -> Response:
    data = json.loads(await request.body())
    if data.get("stream"):

        async def events() -> AsyncIterator[bytes]:
            for chunk in CHUNKS:
                yield chunk

        return StreamingResponse(events(), media_type="text/event-stream")
    return Response(COMPLETION, media_type="application/json")


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _serve(app: Any, port: int, group: Any) -> uvicorn.Server:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    group.start_soon(server.serve)
    while not server.started:  # noqa: ASYNC110 - uvicorn sets it
        await anyio.sleep(0.01)
    return server


async def _timed(
    client: httpx.AsyncClient, requests: int, concurrent: int, stream: bool
) -> list[float]:
    """Seconds per request (or to the first byte of a stream)."""
    body = {**BODY, "stream": True} if stream else BODY
    times: list[float] = []
    left = iter(range(requests))

    async def one() -> None:
        started = time.perf_counter()
        if stream:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                first = True
                async for _ in response.aiter_raw():
                    if first:
                        times.append(time.perf_counter() - started)
                        first = False
        else:
            answer = await client.post("/v1/chat/completions", json=body)
            answer.raise_for_status()
            times.append(time.perf_counter() - started)

    async def caller() -> None:
        for _ in left:
            await one()

    async with anyio.create_task_group() as callers:
        for _ in range(concurrent):
            callers.start_soon(caller)
    return times


async def measure(requests: int) -> dict[str, dict[str, float]]:
    upstream_port, proxy_port = _port(), _port()
    harness = Harness()
    harness.plugin(Retry(stage="model", attempts=3))
    harness.plugin(ToolCallLimit(per_turn=40))
    harness.plugin(RepeatToolReminder())
    upstream_app = Starlette(
        routes=[Route("/v1/chat/completions", _upstream_chat, methods=["POST"])]
    )
    proxy = ModelProxy(harness, f"http://127.0.0.1:{upstream_port}")
    results: dict[str, dict[str, float]] = {}
    async with anyio.create_task_group() as group:
        servers = [
            await _serve(upstream_app, upstream_port, group),
            await _serve(proxy.app, proxy_port, group),
        ]
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        sides = {"direct": upstream_port, "proxy": proxy_port}
        cases: dict[str, Callable[[httpx.AsyncClient], Awaitable[list[float]]]] = {
            "1 client": lambda c: _timed(c, requests, 1, False),
            "100 clients": lambda c: _timed(c, requests * 3, 100, False),
            "stream, first byte": lambda c: _timed(c, requests, 1, True),
        }
        for case, run in cases.items():
            results[case] = {}
            for _ in range(2):  # interleaved rounds; the second is kept (warm)
                for side, port in sides.items():
                    async with httpx.AsyncClient(
                        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30
                    ) as client:
                        results[case][side] = statistics.median(await run(client)) * 1000
        for server in servers:
            server.should_exit = True
    await proxy.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    options = parser.parse_args()
    results = anyio.run(measure, options.requests)
    print("| case | direct ms | through the proxy ms | added ms | ratio |")
    print("|------|-----------|----------------------|----------|-------|")
    for case, sides in results.items():
        direct, proxied = sides["direct"], sides["proxy"]
        print(
            f"| {case} | {direct:.2f} | {proxied:.2f} | {proxied - direct:.2f} | "
            f"{proxied / direct:.2f}x |"
        )


if __name__ == "__main__":
    main()
