"""The "Use a real model" guide runs as written, against a real loopback chat server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.chat_server import Answer, ChatServer
from tests.integrations.messages_server import MessagesServer, Reply, signature
from tests.test_docs import run_page


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the page's LiteLLM example runs on asyncio, as LiteLLM does


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211")
def test_the_models_guide_runs_against_real_servers(
    chat_server: ChatServer,
    messages_server: MessagesServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat_server.require_reasoning = True
    chat_server.script = [
        Answer(tool_calls=(("c1", "read_file", '{"path": "a.txt"}'),), reasoning="Read it."),
        Answer("a.txt says hello."),
        # the LiteLLM example
        Answer(tool_calls=(("c2", "read_page", '{"path": "install.md"}'),), reasoning="Read."),
        Answer("Install with pip."),
    ]
    messages_server.script = [
        Reply(
            thinking="Search first.",
            tool_uses=(("toolu_1", "search", {"query": "install"}),),
            usage=(100, 20, 0, 900),
        ),
        Reply(thinking="Read it.", tool_uses=(("toolu_2", "read_page", {"path": "install.md"}),)),
        Reply("pip install guardstack", usage=(50, 10, 900, 0)),
    ]
    monkeypatch.setenv("DEEPSEEK_BASE_URL", chat_server.base_url)
    monkeypatch.setenv("DEEPSEEK_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", messages_server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.chdir(tmp_path)
    run_page("docs/models.md", tmp_path)
    printed = capsys.readouterr().out
    # your own model: a stream with no first byte is cut; one that streams is answered
    assert (
        "error - ModelError: MODEL_TIMEOUT: model call timed out: no first byte within 100ms\n"
        "completed - all good"
    ) in printed
    # Claude: three typed tools, thinking sent back signed, cache usage counted
    claude = "completed - pip install guardstack - Usage(input_tokens=1960, output_tokens=35"
    assert f"{claude}, cached_input_tokens=900" in printed
    assert "cache_write_tokens=900" in printed
    tools = messages_server.requests[0]["tools"]
    assert [t["name"] for t in tools] == ["search", "read_page", "note"]
    assert tools[2]["input_schema"]["required"] == ["text"]
    assert messages_server.requests[0]["system"] == "Answer from the docs."
    assert messages_server.requests[2]["messages"][3]["content"][0]["signature"] == signature(
        "Read it."
    )
    # LiteLLM: through the same chat server
    assert "completed - Install with pip." in printed
    assert chat_server.requests[3]["model"] == "deepseek-chat"
    assert "completed - a.txt says hello. - Usage(input_tokens=20, output_tokens=10" in printed
    assert "'path': {'type': 'string', 'description': \"The file's path, relative to" in printed
    first, second = chat_server.requests[:2]
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
