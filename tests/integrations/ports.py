"""Loopback ports for tests that start servers: a free one, and waiting for a listener."""

from __future__ import annotations

import socket

import anyio


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def until_listening(port: int, timeout_s: float = 20, host: str = "127.0.0.1") -> None:
    """Return once something accepts connections on ``host:port`` (another process starts
    it)."""
    with anyio.fail_after(timeout_s):
        while True:
            try:
                with socket.create_connection((host, port), timeout=0.2):
                    return
            except OSError:
                await anyio.sleep(0.05)
