"""The framework adapters with their real runtimes, not hooks called by hand: the Claude
Agent SDK driving the Claude Code CLI it ships, and a Google ADK ``Runner`` with a
``Gemini`` model — each model a loopback runaway (``runaway.py``) that asks for the
same shell command again and again, in real time (the runtimes are real processes and
real event loops)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from guardstack.guards import GENTLE_TEXT, RepeatToolReminder, ToolCallLimit
from guardstack.pipeline import Harness
from tests.integrations.runaway import Runaway


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # both runtimes are asyncio's


async def test_the_claude_agent_sdks_hooks_deny_and_end_the_run_under_its_own_cli(
    tmp_path: Path,
) -> None:
    """Reported: under the CLI the SDK ships, ``guardstack_hooks`` answered "no opinion"
    to all 20 calls of a runaway Bash loop under ``ToolCallLimit(per_turn=5)`` and no
    reminder was added: every hook input carries a fresh copy of ``prompt_id``, and
    runs were keyed by its identity. Keyed by value, the sixth call is denied and ends
    the run, and the reminder reaches the model."""
    from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

    from guardstack.integrations.claude_agent import guardstack_hooks

    (tmp_path / "notes.txt").write_text("hello", "utf-8")
    harness = Harness()
    harness.plugin(RepeatToolReminder())
    harness.plugin(ToolCallLimit(per_turn=5, on_exceeded="end_turn"))
    with Runaway(bound=20) as upstream:
        options = ClaudeAgentOptions(
            hooks=guardstack_hooks(harness),
            allowed_tools=["Bash"],
            cwd=str(tmp_path),
            env={
                "ANTHROPIC_BASE_URL": upstream.url,
                "ANTHROPIC_API_KEY": "sk-any",
                "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude"),
                "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            },
        )
        messages = []
        with anyio.fail_after(120):
            async for message in query(prompt="List the files.", options=options):
                messages.append(message)
        reminded = [GENTLE_TEXT[:40] in seen.text() for seen in upstream.model_requests()]
    assert isinstance(messages[-1], ResultMessage)
    assert upstream.calls_made == 6  # five ran; the sixth was denied and ended the run
    assert len(upstream.model_requests()) == 6
    assert any(reminded)


# google-genai's aiohttp session subclasses aiohttp's ClientSession (upstream's warning)
@pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
async def test_an_adk_runners_invocation_ends_when_a_cap_ends_the_turn(tmp_path: Path) -> None:
    """Reported: through a real ``Runner`` the cap refused every call after the fifth,
    but ``end_turn`` did not end the run — the runner asked the model again after each
    refusal (21 requests). Now the plugin ends the invocation (ADK's
    ``end_invocation``). The model is ADK's own ``Gemini``, speaking the Gemini API to
    a loopback fake."""
    from google.adk.agents import LlmAgent
    from google.adk.apps import App
    from google.adk.models import Gemini
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    from guardstack.integrations.adk import GuardstackPlugin

    def run_shell_command(command: str) -> str:
        """Run a shell command and return its output."""
        return "README.md\nmain.py"

    os.environ.setdefault("GOOGLE_API_KEY", "a-dummy-key")
    harness = Harness()
    harness.plugin(ToolCallLimit(per_turn=5, on_exceeded="end_turn"))
    with Runaway(bound=20, tool="run_shell_command") as upstream:
        model = Gemini(model="gemini-2.5-flash", base_url=upstream.url)
        agent = LlmAgent(name="assistant", model=model, tools=[run_shell_command])
        app = App(name="guarded", root_agent=agent, plugins=[GuardstackPlugin(harness)])
        runner = InMemoryRunner(app=app)
        session = await runner.session_service.create_session(app_name="guarded", user_id="u")
        asked = types.Content(role="user", parts=[types.Part(text="List the files.")])
        texts: list[str] = []
        with anyio.fail_after(60):
            async for event in runner.run_async(
                user_id="u", session_id=session.id, new_message=asked
            ):
                parts = event.content.parts if event.content and event.content.parts else []
                texts += [part.text for part in parts if part.text]
        paths = [seen.path for seen in upstream.model_requests()]
    assert upstream.calls_made == 6
    assert len(paths) == 6  # where it went on to 21
    # the run ends with the model's answer saying why (#66: it ended on the refused
    # call's function_response, saying nothing)
    assert texts[-1].startswith("Stopped by guardstack: tool call limit reached")
    assert all(path.startswith("/v1beta/models/gemini-2.5-flash:") for path in paths)
