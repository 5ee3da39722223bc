"""The public surface: honest __all__, typed packages, no SDK behind `import pipeline`."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PACKAGES = ["guardstack.pipeline", "guardstack.guards", "guardstack.wrappers"]
#: The other modules whose ``__all__`` is public API (docs/releases.md).
MODULES = [
    "guardstack.pipeline.contract",
    *(
        f"guardstack.integrations.{name}"
        for name in (
            "anthropic", "openai", "litellm", "redis", "mcp", "model_proxy", "langchain",
            "openai_agents", "pydantic_ai", "temporal", "otel", "claude_agent", "adk",
        )
    ),
]  # fmt: skip


def _check_all(name: str, *, imported_names_count: bool) -> Any:
    package = importlib.import_module(name)
    exported = set(package.__all__)
    assert len(exported) == len(package.__all__), "duplicates in __all__"
    for attribute in exported:
        assert hasattr(package, attribute), f"{name}.{attribute} is in __all__ but missing"
    public = {
        attribute
        for attribute, value in vars(package).items()
        if not attribute.startswith("_")
        and not isinstance(value, type(sys))
        and (
            imported_names_count
            or ((inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == name)
        )
    }
    assert public - {"annotations"} <= exported, f"public but not in __all__: {public - exported}"
    return package


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_exactly_what_the_package_exports(name: str) -> None:
    package = _check_all(name, imported_names_count=True)
    assert (Path(package.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("name", MODULES)
def test_each_public_module_lists_what_it_defines_in_all(name: str) -> None:
    """What a module defines (its public classes and functions, not what it imports)
    is in its ``__all__``, and all of its
    ``__all__`` is there: the API reference and the deprecation policy rest on it."""
    _check_all(name, imported_names_count=False)


def test_importing_the_packages_does_not_import_the_opentelemetry_sdk(tmp_path: Path) -> None:
    code = (
        "import sys, guardstack.pipeline, guardstack.guards, guardstack.wrappers; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    assert output.strip() == "[]"
