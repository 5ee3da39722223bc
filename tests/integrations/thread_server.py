"""A loopback ASGI server in a thread of its own (its own event loop): for fake upstreams
that clients in other processes, or on trio, talk to."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class ThreadServer:
    """``app`` served on a free loopback port from ``start()`` to ``stop()``."""

    def __init__(self, app: Any, what: str) -> None:
        self.app, self.what = app, what
        self.port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        import uvicorn

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.what} did not start")
            time.sleep(0.01)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
