"""The "Use a real model" guide runs as written, against a real loopback chat server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.chat_server import Answer, ChatServer
from tests.test_docs import run_page


def test_the_models_guide_runs_against_a_real_server(
    chat_server: ChatServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat_server.require_reasoning = True
    chat_server.script = [
        Answer(tool_calls=(("c1", "read_file", '{"path": "a.txt"}'),), reasoning="Read it."),
        Answer("a.txt says hello."),
    ]
    monkeypatch.setenv("DEEPSEEK_BASE_URL", chat_server.base_url)
    monkeypatch.setenv("DEEPSEEK_API_KEY", "test-key")
    monkeypatch.chdir(tmp_path)
    run_page("docs/models.md", tmp_path)
    printed = capsys.readouterr().out
    assert "completed - a.txt says hello. - Usage(input_tokens=20, output_tokens=10" in printed
    first, second = chat_server.requests
    assert first["model"] == "deepseek-chat"
    assert first["messages"][0] == {"role": "system", "content": "Be careful."}
    assert second["messages"][2]["reasoning_content"] == "Read it."
    assert second["messages"][3] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "contents of a.txt",
    }
    saved = (tmp_path / "session-1.jsonl").read_text("utf-8").splitlines()
    assert json.loads(saved[1]) == {"type": "system/message", "text": "Be careful."}
