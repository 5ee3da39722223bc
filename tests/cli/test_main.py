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
    # the gateway: a team's day spent ends the runaway agent's run as its model's last words
    gateway = text.split("6. ")[1]
    assert "After 4 answers the day was spent, and request 5 was answered" in gateway
    assert "Stopped by budgets: team 'acme/ci' has used $0.0960 of its $0.1000 this day" in gateway


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


def test_transcript_of_half_a_surrogate_pair_prints_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from guardstack.pipeline import Session, UserMessage
    from guardstack.pipeline.values import USER_SOURCE

    session = Session("s")
    session.append(UserMessage("half \ud83d pair", USER_SOURCE))
    session.save(tmp_path / "s.jsonl")
    assert main(["transcript", str(tmp_path / "s.jsonl")]) == 0
    assert "half \\ud83d pair" in capsys.readouterr().out


def test_transcript_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    import subprocess
    import sys

    from guardstack.pipeline import Session, UserMessage
    from guardstack.pipeline.values import USER_SOURCE

    session = Session("s")
    for number in range(5000):
        session.append(UserMessage(f"line {number}", USER_SOURCE))
    session.save(tmp_path / "s.jsonl")
    command = f"{sys.executable} -m guardstack.cli.main transcript s.jsonl | head -n 1"
    finished = subprocess.run(
        command, shell=True, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert finished.stdout == "[\n"
    assert finished.stderr == ""


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe not utf-8", b'{"type": "session"}\n{"type": "turn/start", "turn": "x"}\n'],
)
def test_a_bad_session_file_is_one_line_and_exit_2(
    content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s.jsonl").write_bytes(content)
    assert main(["transcript", str(tmp_path / "s.jsonl")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("guardstack: ")
    assert error.count("\n") == 1
