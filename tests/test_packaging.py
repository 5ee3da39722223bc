"""What an installed guardstack puts on the path: ``guardstack`` and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the sdist, as ``python -m build`` does for a release."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (built,) = out.glob("*.whl")
    assert len(list(out.glob("*.tar.gz"))) == 1
    return built


def test_the_wheels_only_top_level_name_is_guardstack(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {
        name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")
    }
    assert top_level == {"guardstack"}
    assert "guardstack/__init__.py" not in names  # a namespace package
    for package in ("pipeline", "guards", "wrappers", "integrations", "cli"):
        assert f"guardstack/{package}/__init__.py" in names
        assert f"guardstack/{package}/py.typed" in names


def test_the_wheel_carries_every_module_subpackages_included(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        f"guardstack/{path.relative_to(ROOT).as_posix()}"
        for folder in ("pipeline", "guards", "wrappers", "integrations", "cli")
        for path in (ROOT / folder).rglob("*.py")
    }
    assert "guardstack/cli/compare/engine.py" in sources
    assert sorted(sources - names) == []


def test_the_installed_wheel_imports_under_guardstack_only(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import guardstack.pipeline, guardstack.guards, guardstack.wrappers, importlib.util;"
        "print(guardstack.pipeline.__file__);"
        "print([n for n in ('pipeline', 'guards', 'wrappers', 'integrations', 'cli')"
        " if importlib.util.find_spec(n)])"
    )
    # -S: no site-packages (so not the editable install); the dependencies come from
    # this environment's site-packages, appended after the wheel's target.
    import anyio
    import attrs
    import opentelemetry

    dependencies = {str(Path(str(module.__file__)).parents[1]) for module in (anyio, attrs)}
    dependencies.add(str(Path(next(iter(opentelemetry.__path__))).parent))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), *sorted(dependencies)]))
    output = subprocess.run(
        [sys.executable, "-S", "-c", code],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment,
    ).stdout.splitlines()
    assert output[0].startswith(str(target / "guardstack" / "pipeline"))
    assert output[1] == "[]"
