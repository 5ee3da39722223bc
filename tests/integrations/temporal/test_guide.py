"""The Temporal guide runs as written, against Temporal's time-skipping test server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_docs import run_page

pytest.importorskip("temporalio", reason="pip install 'guardstack[temporal]'")


def test_the_temporal_guide_runs_against_the_test_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = Path(sys.executable).parent / "temporal-test-server"
    monkeypatch.setenv("TEMPORAL_TEST_SERVER", str(server))
    monkeypatch.chdir(tmp_path)
    run_page("docs/temporal.md", tmp_path)
    assert capsys.readouterr().out.splitlines()[-1] == "completed - Found one TODO."
    assert (tmp_path / "thread-1.jsonl").exists()
