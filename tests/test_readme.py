"""Every Python example in the README runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from guardstack.pipeline import Harness

ROOT = Path(__file__).parents[1]
BLOCKS = re.findall(
    r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.DOTALL
)


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 6


def test_every_python_block_runs_in_order(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    namespace: dict[str, Any] = {
        "harness": Harness(),  # the snippets that continue an earlier example
        "tracer_provider": TracerProvider(),
        "meter_provider": MeterProvider(),
    }
    for block in BLOCKS:
        exec(compile(block, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out
    assert '\'content\': \'{"url": "https://example.org", "status": 200}\'' in printed
    assert "completed - Found one TODO." in printed
    assert "You are repeating the exact same tool call" in printed
    assert "0. tool-call-timeout-policy" in printed
