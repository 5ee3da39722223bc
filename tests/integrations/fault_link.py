"""A loopback TCP link in front of a server that can lose replies: the request reaches
the server (its script runs) and the answer never comes back — the fault a timeout
hides, and the one that leaks slots and double-counts when a store is not idempotent.

It runs in threads of its own, so tests on any event loop (or none) can use it; and
``LoopThread`` runs an asyncio loop in a thread for hypothesis state machines, whose
rules are plain functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from typing import Any


class FaultLink:
    """``127.0.0.1:port`` forwards to ``127.0.0.1:target``; ``lose(n)`` drops the next
    ``n`` replies, each with its connection (the client sees the link go down)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._lose = 0
        self._lock = threading.Lock()
        self.lost = 0  # replies dropped so far
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose(self, replies: int) -> None:
        with self._lock:
            self._lose = replies

    def _take_loss(self) -> bool:
        with self._lock:
            if self._lose > 0:
                self._lose -= 1
                self.lost += 1
                return True
            return False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if replies and self._take_loss():
                    break  # the reply is lost, and the link with it
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()


class LoopThread:
    """An asyncio event loop in a thread: ``run(coroutine)`` waits for its answer."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
