"""Hostile MCP servers: each gets a clear error or a clean exit, never a hang or a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guardstack.cli.mcp_proxy import parse_ms, parse_timeouts
from guardstack.integrations.mcp import MAX_PAGES, McpServerError, mcp_tools
from guardstack.pipeline import ConfigError
from tests.integrations.test_mcp import ROOT, connected

PROXY = [sys.executable, "-c", "from guardstack.cli.main import main; raise SystemExit(main())"]


def hostile(mode: str, directory: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tests.integrations.hostile_mcp_server",
        mode,
        str(directory / "server.pid"),
    ]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent, which is gone too) counts as gone
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


@pytest.mark.parametrize("mode", ["endless-cursor", "same-cursor"])
async def test_a_tools_list_that_never_ends_is_refused(tmp_path: Path, mode: str) -> None:
    async with connected(hostile(mode, tmp_path), tmp_path) as session:
        with pytest.raises(McpServerError, match=r"repeats the cursor|still paging after"):
            await mcp_tools(session)
    assert MAX_PAGES == 1_000


def run_proxy(
    arguments: list[str], tmp_path: Path, **options: object
) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = subprocess.run(
        [*PROXY, "mcp-proxy", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **options,  # type: ignore[call-overload]
    )
    return done


def test_a_proxy_in_front_of_two_tools_with_one_name_exits_with_one_line(tmp_path: Path) -> None:
    proxy = subprocess.Popen(
        [*PROXY, "mcp-proxy", "--", *hostile("duplicates", tmp_path)],
        cwd=ROOT,
        stdin=subprocess.PIPE,  # held open: the client is still there
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.wait(timeout=30) == 2
        assert proxy.stderr is not None
        stderr = proxy.stderr.read()
    finally:
        proxy.kill()
        for stream in (proxy.stdin, proxy.stdout, proxy.stderr):
            if stream is not None:
                stream.close()
    assert stderr.strip().splitlines()[-1] == (
        "guardstack: the MCP server lists tools under the same name twice: twin"
    )
    assert "Traceback" not in stderr


def test_a_proxy_whose_client_leaves_before_the_server_answers_stops_with_its_child(
    tmp_path: Path,
) -> None:
    proxy = subprocess.Popen(
        [*PROXY, "mcp-proxy", "--", *hostile("silent", tmp_path)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        pid_file = tmp_path / "server.pid"
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert proxy.stdin is not None
        proxy.stdin.close()  # the client goes away
        assert proxy.wait(timeout=20) == 0
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        proxy.kill()
        proxy.wait()
        for stream in (proxy.stdout, proxy.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x=5²", "'5²' is not a whole number of milliseconds"),
        ("x=-1", "'-1' must be from 1 to"),
        ("x=abc", "'abc' is not a whole number"),
        ("nothing", "must be PATTERN=MS"),
    ],
)
def test_bad_timeouts_say_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_timeouts([value])


def test_a_bad_default_timeout_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--default-timeout '0' must be from 1"):
        parse_ms("--default-timeout", "0")
    done = run_proxy(["--default-timeout", "1.5", "--", "true"], tmp_path, input="")
    assert done.returncode == 2
    assert "is not a whole number of milliseconds" in done.stderr
    assert "Traceback" not in done.stderr
