"""A loopback upstream that plays a recorded stream (``tests/fixtures/streams/``).

Every model request is answered with the fixture set in ``name``: its unstreamed twin
(``NAME.json``) when the request does not stream, else its events (``NAME.sse``), cut
into pieces at ``cuts`` (byte offsets) and written one piece at a time — so what the
client reads arrives as a real connection may deliver it, an event split anywhere.
Runs in a thread with its own event loop (the clients under test may run on trio).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parents[1] / "fixtures" / "streams"


def manifest() -> dict[str, Any]:
    """Each recording: its wire, the usage it reports, what it shows."""
    loaded: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text("utf-8"))
    return loaded


class Recorded:
    """The upstream (see the module docstring)."""

    def __init__(self) -> None:
        self.name = ""
        #: A stream to play instead of a recording's (``name`` then only picks its twin).
        self.raw: bytes | None = None
        #: Seconds between two pieces (a model that writes as it thinks).
        self.delay_s = 0.0
        #: How many streams were played to their end.
        self.finished = 0
        self.cuts: list[int] = []
        self.port = 0
        self.requests: list[dict[str, Any]] = []

    def stream_bytes(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return (FIXTURES / f"{self.name}.sse").read_bytes()

    def twin_bytes(self) -> bytes:
        return (FIXTURES / f"{self.name}.json").read_bytes()

    def pieces(self) -> list[bytes]:
        data = self.stream_bytes()
        edges = [0, *sorted({cut for cut in self.cuts if 0 < cut < len(data)}), len(data)]
        return [data[start:end] for start, end in itertools.pairwise(edges)]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response, StreamingResponse
        from starlette.routing import Route

        async def handle(request: Request) -> Response:
            body = json.loads(await request.body() or b"{}")
            self.requests.append(body)
            streamed = bool(body.get("stream")) or request.url.path.endswith(
                ":streamGenerateContent"
            )
            if not streamed:
                return Response(self.twin_bytes(), media_type="application/json")

            async def play() -> Any:
                import asyncio

                for piece in self.pieces():
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    yield piece
                self.finished += 1

            return StreamingResponse(play(), media_type="text/event-stream")

        paths = ["/v1/chat/completions", "/v1/responses", "/v1/messages",
                 "/v1beta/models/{target}"]  # fmt: skip
        return Starlette(routes=[Route(path, handle, methods=["POST"]) for path in paths])

    def __enter__(self) -> Recorded:
        from tests.integrations.thread_server import ThreadServer

        self._served = ThreadServer(self.app, "the recorded upstream")
        self.port = self._served.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._served.stop()
