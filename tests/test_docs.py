"""Every Python example in the README and the guides runs as written, and says what it claims.

Each block runs as a reader who copies it would: on its own, in an empty folder — or,
when its first line says ``# continues …``, after the block before it.
``docs/models.md`` and ``docs/mcp.md`` talk to servers, so they run in
``tests/integrations/`` against real ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
PAGES = ["README.md", *sorted(f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md"))]
ELSEWHERE = {
    "docs/models.md": "tests/integrations/test_docs_models.py",
    "docs/mcp.md": "tests/integrations/test_docs_mcp.py",
    "docs/mcp-gateway.md": "tests/integrations/test_docs_mcp.py",
    "docs/temporal.md": "tests/integrations/temporal/test_guide.py",
    "docs/shared-limits.md": "tests/integrations/test_redis.py",
}

#: What each page's examples must print (a page without examples lists nothing).
PRINTS = {
    "docs/api.md": [],  # the reference, built from the docstrings
    "docs/releases.md": [],
    "docs/store-seams.md": [
        "found\nfound\nError: search has made its 2 calls today",
        "found / TOOL_RATE_LIMITED",
    ],
    "docs/operate.md": [
        "completed - done",
        'Error: tool "lookup" is paused: the index is being rebuilt until 14:00\nTOOL_UNAVAILABLE'
        "\nfound\ncontrol: no tool 'lookpu' (did you mean 'lookup'?); the tools are lookup",
        "Reloaded(version=1, plugins=('timeout', 'retry'), warnings=())\nConfigError - 1",
        "answered by mirror-us\nanswered by mirror-us\n['search', 'mirror-eu', 'mirror-us', "
        "'mirror-us']",
        "['from big', 'from big', 'from big', 'from small', 'from small']",
    ],
    "docs/streams-tokens-priority.md": [
        "completed - The answer is 42. - 2 requests",
        "index -> indexed\nstalls -> Error: tool call timed out: no progress report for 80ms",
        "completed - ok\ncompleted - ok\nerror - ModelError: MODEL_RATE_LIMITED: model gpt-x is "
        "rate limited: 6000 of its 5000 tokens per minute are in use.",
        "['batch', 'batch', 'person', 'batch', 'person', 'batch', 'batch', 'batch']",
    ],
    "README.md": [
        "completed - Found one TODO.",
        "You are repeating the exact same tool call",
        "'q': {'type': 'string', 'description': 'The text to look for.'}",
    ],
    "docs/tools.md": [
        '\'content\': \'{"url": "https://example.org", "status": 200}\'',
        "10 top hits for anyio",
        "Error: argument 'limit' must be an integer, got text 'ten'",
    ],
    "docs/agents.md": [
        "completed 2 steps - It is 09:30.",
        "'turn/start', 'user/message', 'step/start', 'assistant/message', 'tool/call'",
        "logged turn/end",
        "{'role': 'system', 'content': 'Be brief.'}",
        "max_parallel_tool_calls=1: at most 1 calls at once\n"
        "max_parallel_tool_calls=4: at most 4 calls at once",
        "blocked - usage-limit: this session cost $1.2030 and the limit is $1.0000 per session"
        " - 1200000",
    ],
    "docs/agent-trees.md": [
        "no cap: $2.00",
        "capped at $1.25: $1.25, blocked",
        "Error: agent 'delegate' was not started: agent-limit: a child here would be at depth 4 "
        "and the limit is max_depth=3 (the root agent is depth 1); do the task yourself",
        "Budget left: 9 more steps after this one, 5 tool calls, $2.00, 120 s. Plan to "
        "finish within it.",
    ],
    "docs/approval.md": [
        "tool-call-limit registered after approval: a person is asked about calls it may "
        "then refuse; register it before approval so they deny first",
        "Error: rejected: prod is frozen this week - I could not deploy: prod is frozen.",
        "approval d1 deploy {'target': 'prod'}\ncompleted - Deployed.",
    ],
    "docs/guards.md": [
        "0. tool-call-timeout-policy",
        "thread-a None\nthread-a None\nthread-a TOOL_DENIED\nthread-b None\n",
        "thread-a after reset None",
        'Potential loop detected: the sequence "read" → "edit" repeated 3 times',
        "deadline - turn-deadline: the turn's 50 ms ran out",
        "completed - 'Plan: read the config.\\nI will check the config file once more to "
        "be sure. '",
    ],
    "docs/order.md": [
        "warning: retry waits for TOOL_TIMOUT, which no layer in this stack produces"
    ],
    "docs/frameworks.md": [
        "Error: tool call timed out after 50ms\nError: tool call timed out after 50ms\n"
        "failed Error: tool call timed out after 50ms\n",
        "{} deny False\n",
        "\nError: tool call timed out after 50ms\n",
    ],
    "docs/resilience.md": [
        '0.1s\nError: tool "status" is unavailable: it has been failing, so\n',
        "\n4\n",
    ],
    "docs/telemetry.md": [],
    "docs/index.md": [],
    "docs/testing.md": [],
    "docs/speed.md": [],
    "docs/errors.md": [],
    "docs/design.md": [],
    "docs/models.md": [],
    "docs/mcp.md": [],
    "docs/mcp-gateway.md": [],
    "docs/model-proxy.md": [],
    "docs/temporal.md": [],
    "docs/shared-limits.md": [],
    "docs/plugins.md": [
        "print('hello')\nread_file's result held a secret and was withheld\n"
        "Error: write_file is not allowed in read-only mode\nNothing to change.\n"
        "model calls: 1\nwrites - read-only: `writes` must be a list of tool names, "
        "got 'write_file'",
        "0. retry: Retry(attempts=3, stage='model', retry_on=['MODEL_OVERLOADED', "
        "'MODEL_RATE_LIMITED', 'MODEL_TIMEOUT', 'MODEL_UNAVAILABLE'], backoff_ms=100, "
        "max_backoff_ms=10000, jitter=True, budget=None, seed=None)\n1. timeout: "
        "Timeout(stage='model', ms=60000, code='MODEL_TIMEOUT', first_byte_ms=None, "
        "idle_ms=None)",
    ],
    "docs/team-budgets.md": [
        "refused after 4: team 'acme/research' has used $0.0440 of its $0.0500 this day; "
        "this request's reservation of $0.0150 would pass it",
        "$0.2871 spent\nname              spent_usd      tokens  requests\n"
        "acme/ci              0.1650      950000         1\n"
        "acme/research        0.1221       53000         2",
        "blocked - Read 3 of 5 files; b.py and c.py are left. Run the tests next.\n"
        "model-call-limit: this turn made 3 model calls and the limit is 4 per turn",
    ],
}


def python_blocks(page: str) -> list[str]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


#: How a block that is not whole on its own says so, in its first line.
CONTINUES = "# continues "


def run_page(page: str, directory: Path, namespace: dict[str, Any] | None = None) -> None:
    """Run a page's blocks in order, in ``directory`` (an empty folder), each as a reader
    who copies it would: on its own (a fresh namespace), unless its first line says
    ``# continues …`` — then after the block before it, in that block's namespace.
    ``namespace`` seeds the first block (a test's servers)."""
    seed = dict(namespace or {})
    scope: dict[str, Any] = dict(seed)
    for number, block in enumerate(python_blocks(page)):
        if not block.startswith(CONTINUES):
            scope = dict(seed)  # its own file: nothing from the blocks before
        elif number == 0:
            raise AssertionError(f"{page}: the first block cannot continue another")
        exec(compile(block, f"{page} (block {number + 1})", "exec"), scope)


def test_every_page_is_checked_and_the_readme_has_its_example() -> None:
    assert set(PRINTS) == set(PAGES)
    assert python_blocks("README.md")
    for page, claims in PRINTS.items():
        if claims:
            assert python_blocks(page), page


@pytest.mark.parametrize("page", [page for page in PAGES if page not in ELSEWHERE])
def test_every_python_block_runs_and_prints_what_it_claims(
    page: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    run_page(page, tmp_path)
    printed = capsys.readouterr().out
    for claim in PRINTS[page]:
        assert claim in printed, (page, claim)


def test_every_plugin_list_in_the_docs_loads() -> None:
    """A YAML block that is a plugin list (entries with ``name``) is a configuration a
    reader will copy: it must load. One that needs an extra this environment lacks (a
    Redis store on a Python the extra does not install on) must say so by name."""
    import importlib.util

    import yaml

    from guardstack.pipeline import Harness

    loaded = 0
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL):
            entries = yaml.safe_load(block)
            if isinstance(entries, list) and all(
                isinstance(entry, dict) and "name" in entry for entry in entries
            ):
                stores = {entry.get("config", {}).get("url", "") for entry in entries}
                needs_redis = any(str(url).startswith("redis") for url in stores)
                if needs_redis and importlib.util.find_spec("redis") is None:
                    with pytest.raises(ImportError, match=r"pip install 'guardstack\[redis\]'"):
                        Harness().load(entries)
                    loaded += 1  # checked: refused, naming what to install
                    continue
                Harness().load(entries)
                loaded += 1
    assert loaded >= 5
