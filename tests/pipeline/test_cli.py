"""The command line and the demo, as a new user runs them (the demo in virtual time)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from guardstack.cli.demo import run_demo
from guardstack.cli.main import main

EXAMPLES = Path(__file__).parents[2] / "examples"


async def test_the_demo_shows_what_each_order_means_exactly(tmp_path: Path) -> None:
    out = io.StringIO()
    await run_demo(out, save_to=tmp_path / "demo.jsonl")
    text = out.getvalue()
    order = text.split("2. ")[0]
    assert (
        "onion    retry -> tool-call-timeout-policy -> tool\n     result   3 results\n"
        "     attempts 3, elapsed 600 ms" in order
    )
    assert (
        "onion    tool-call-timeout-policy -> retry -> tool\n     result   Error: tool "
        "call timed out after 200ms\n     attempts 1, elapsed 200 ms" in order
    )
    assert (
        "result   Error: tool call timed out after 400ms\n     attempts 2, elapsed 400 ms" in order
    )
    assert "[repeat-tool-reminder] You are repeating the exact same tool call" in text
    assert "result Error: tool call timed out after 300ms" in text
    assert "every request is the session log rebuilt (verified)" in text
    # span durations come from the SDK's wall clock, so only the shape is asserted here
    assert re.search(
        r"tool-call-timeout-policy  \(\d+ ms, attempt 2, error.type=TOOL_TIMEOUT\)", text
    )
    assert (tmp_path / "demo.jsonl").is_file()
    assert "turn ended blocked after 5 tool runs and 6 model calls" in text


def test_describe_prints_the_onion_of_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", str(EXAMPLES / "ordered-stack.yaml")]) == 0
    printed = capsys.readouterr().out
    assert "dispatch:\n  0. metrics" in printed
    assert "3. tool-call-timeout-policy" in printed


def test_transcript_prints_the_rebuilt_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(
        '{"type": "session", "format": 1, "session_id": "s"}\n'
        '{"type": "user/message", "text": "hi", "source": '
        '{"kind": "user", "plugin": null}}\n',
        encoding="utf-8",
    )
    assert main(["transcript", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == [{"role": "user", "content": "hi"}]


def test_bad_config_is_a_clear_error_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("- id: x\n  name: timeout\n  config: {ms: 0}\n", encoding="utf-8")
    assert main(["describe", str(path)]) == 2
    assert "plugin 'x' (timeout): config key 'ms' = 0" in capsys.readouterr().err
