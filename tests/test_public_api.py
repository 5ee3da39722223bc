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
    "guardstack.pipeline.plugin",
    "guardstack.pipeline.contract",
    *(
        f"guardstack.integrations.{name}"
        for name in (
            "anthropic", "openai", "litellm", "redis", "mcp", "langchain",
            "openai_agents", "pydantic_ai", "temporal", "otel", "claude_agent", "adk",
        )
    ),
    *(
        f"guardstack.gateway.{name}"
        for name in ("model_proxy", "mcp_gateway", "tenants", "budgets", "spend", "decision_log")
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


def test_a_plugin_authors_name_imported_from_the_package_warns_and_names_its_home() -> None:
    import guardstack.pipeline as package
    from guardstack.pipeline.contract import LayerInfo
    from guardstack.pipeline.plugin import ModelNext

    with pytest.warns(DeprecationWarning, match=r"import it from guardstack\.pipeline\.plugin"):
        assert package.ModelNext is ModelNext  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"from guardstack\.pipeline\.contract"):
        from guardstack.pipeline import LayerInfo as moved  # type: ignore[attr-defined]
    assert moved is LayerInfo
    assert "ModelNext" not in package.__all__
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = package.Nothing  # type: ignore[attr-defined]


def test_importing_the_packages_does_not_import_the_opentelemetry_sdk(tmp_path: Path) -> None:
    code = (
        "import sys, guardstack.pipeline, guardstack.guards, guardstack.wrappers; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    assert output.strip() == "[]"


def _bare_any(annotation: object) -> bool:
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        return text == "Any" or text.startswith("Any|") or text.endswith("|Any") or "|Any|" in text
    return annotation is Any


def _signatures_with_a_bare_any() -> dict[str, list[str]]:
    """Each public function's and public method's parameters (and ``return``) annotated
    with a bare ``Any``; ``*args``/``**kwargs`` and JSON containers (``dict[str, Any]``)
    do not count."""
    found: dict[str, list[str]] = {}

    def check(name: str, function: object) -> None:
        try:
            signature = inspect.signature(function)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        hits = [
            parameter.name
            for parameter in signature.parameters.values()
            if parameter.kind not in variadic
            and parameter.name not in ("self", "cls")
            and _bare_any(parameter.annotation)
        ]
        if _bare_any(signature.return_annotation):
            hits.append("return")
        if hits:
            found[name] = hits

    for module_name in PACKAGES + MODULES:
        module = importlib.import_module(module_name)
        for attribute in module.__all__:
            value = getattr(module, attribute)
            if inspect.isclass(value):
                check(f"{module_name}.{attribute}", value.__init__)
                for member_name, member in vars(value).items():
                    if member_name.startswith("_"):
                        continue
                    if isinstance(member, staticmethod | classmethod):
                        member = member.__func__
                    if inspect.isfunction(member):
                        check(f"{module_name}.{attribute}.{member_name}", member)
            elif inspect.isfunction(value):
                check(f"{module_name}.{attribute}", value)
    return found


def test_types_reach_the_core_and_any_stays_at_the_edges() -> None:
    """``Any`` is for JSON values and third-party objects at the edge: no public signature
    of the core packages takes or returns a bare ``Any``, and the integrations (where
    a framework's or an SDK's objects pass through) hold at most 15 (the issue's
    goal was 20; the layer bodies, now typed, took the count from 18 to 15)."""
    found = _signatures_with_a_bare_any()
    edges = ("guardstack.int", "guardstack.gateway")
    core = {name: hits for name, hits in found.items() if not name.startswith(edges)}
    assert core == {}
    integrations = [name for name in found if name.startswith("guardstack.int")]
    assert len(integrations) <= 15, sorted(integrations)
    # the gateway, moved out of integrations in 0.2 with the signatures it had: its
    # stores and ASGI objects are third-party; held at what it had when it moved
    gateway = [name for name in found if name.startswith("guardstack.gateway")]
    assert len(gateway) <= 8, sorted(gateway)
