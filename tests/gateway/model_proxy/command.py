"""``guardstack model-proxy`` as a user runs it: the console command in its own process,
on a free loopback port, its standard error kept in a file the test reads."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path

import anyio
import attrs

from tests.integrations.ports import free_port, until_listening

ROOT = Path(__file__).parents[3]


@attrs.define
class Running:
    """A proxy process: its port, its process and the file its standard error goes to."""

    port: int
    process: anyio.abc.Process
    stderr: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def said(self) -> str:
        return self.stderr.read_text("utf-8", errors="replace")


def command(*arguments: str) -> list[str]:
    return [
        sys.executable, "-c", "from guardstack.cli.main import main; raise SystemExit(main())",
        *arguments,
    ]  # fmt: skip


@contextlib.asynccontextmanager
async def running(
    arguments: Sequence[str],
    tmp_path: Path,
    *,
    environment: Mapping[str, str] | None = None,
    name: str = "model-proxy",
    port: int | None = None,
) -> AsyncIterator[Running]:
    """``guardstack model-proxy ARGUMENTS --listen 127.0.0.1:PORT``, until the block ends
    (then SIGTERM, as a service manager stops it, and a bounded wait)."""
    port = port or free_port()
    stderr = tmp_path / f"{name}-{port}.stderr"
    # the default store is a file under XDG_STATE_HOME: each test its own
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), **(environment or {})}
    with stderr.open("wb") as sink:
        process = await anyio.open_process(
            command(name, *arguments, "--listen", f"127.0.0.1:{port}"),
            cwd=str(ROOT),
            env=env,
            stderr=sink,
            stdout=sink,
        )
    proxy = Running(port, process, stderr)
    try:
        try:
            await until_listening(port)
        except BaseException:
            raise AssertionError(f"the proxy did not start:\n{proxy.said()}") from None
        yield proxy
    finally:
        if process.returncode is None:
            process.terminate()
        with anyio.fail_after(15):
            await process.wait()


@contextlib.contextmanager
def started(
    arguments: Sequence[str],
    tmp_path: Path,
    *,
    environment: Mapping[str, str] | None = None,
    name: str = "model-proxy",
) -> Iterator[Running]:
    """``running`` for tests that are not async (a real client is a blocking process)."""
    import socket
    import subprocess
    import time

    port = free_port()
    stderr = tmp_path / f"{name}-{port}.stderr"
    # the default store is a file under XDG_STATE_HOME: each test its own
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), **(environment or {})}
    with stderr.open("wb") as sink:
        process = subprocess.Popen(
            command(name, *arguments, "--listen", f"127.0.0.1:{port}"),
            cwd=str(ROOT),
            env=env,
            stderr=sink,
            stdout=sink,
        )
    proxy = Running(port, process, stderr)  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the proxy did not start:\n{proxy.said()}") from None
                time.sleep(0.05)
        yield proxy
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
