"""The public surface: honest __all__, typed packages, no SDK behind `import pipeline`."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ["guardstack.pipeline", "guardstack.guards", "guardstack.wrappers"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_exactly_what_the_package_exports(name: str) -> None:
    package = importlib.import_module(name)
    exported = set(package.__all__)
    assert len(exported) == len(package.__all__), "duplicates in __all__"
    for attribute in exported:
        assert hasattr(package, attribute), f"{name}.{attribute} is in __all__ but missing"
    public = {
        attribute
        for attribute, value in vars(package).items()
        if not attribute.startswith("_") and not isinstance(value, type(sys))
    }
    assert public - {"annotations"} <= exported, f"public but not in __all__: {public - exported}"
    assert (Path(package.__file__).parent / "py.typed").is_file()  # type: ignore[arg-type]


def test_importing_the_packages_does_not_import_the_opentelemetry_sdk(tmp_path: Path) -> None:
    code = (
        "import sys, guardstack.pipeline, guardstack.guards, guardstack.wrappers; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    assert output.strip() == "[]"
