"""The MCP guide runs as written, against the tests' real MCP server over stdio."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from tests.integrations.test_mcp import ROOT
from tests.test_docs import run_page


def test_the_mcp_guide_runs_against_a_real_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = ROOT / "tests" / "integrations" / "mcp_server.py"  # runs as a plain script
    monkeypatch.setenv(
        "MCP_SERVER", shlex.join([sys.executable, str(script), str(tmp_path / "log")])
    )
    monkeypatch.chdir(tmp_path)
    run_page("docs/mcp.md", tmp_path)
    assert capsys.readouterr().out.splitlines()[-1] == "hello"
    assert (tmp_path / "log").read_text("utf-8").splitlines()[1:] == ["run echo"]


def test_the_gateway_guide_runs_against_two_real_servers_and_prints_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = ROOT / "tests" / "integrations" / "mcp_server.py"
    monkeypatch.setenv(
        "MCP_SERVER", shlex.join([sys.executable, str(script), str(tmp_path / "log")])
    )
    monkeypatch.chdir(tmp_path)
    run_page("docs/mcp-gateway.md", tmp_path)
    printed = capsys.readouterr().out.splitlines()
    page = (ROOT / "docs" / "mcp-gateway.md").read_text("utf-8")
    claimed = page.split("It prints:\n\n```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert printed == claimed
    assert (tmp_path / "log").read_text("utf-8").splitlines().count("run echo") == 2


def test_the_gateway_guide_runs_as_written_with_the_server_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No MCP_SERVER: the example runs the small mcp 2.x server it writes itself."""
    monkeypatch.delenv("MCP_SERVER", raising=False)
    monkeypatch.chdir(tmp_path)
    run_page("docs/mcp-gateway.md", tmp_path)
    printed = capsys.readouterr().out.splitlines()
    page = (ROOT / "docs" / "mcp-gateway.md").read_text("utf-8")
    claimed = page.split("It prints:\n\n```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert printed == claimed
    assert (tmp_path / "notes_server.py").read_text("utf-8").count("MCPServer") >= 2
