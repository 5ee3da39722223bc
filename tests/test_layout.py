"""The source stays a structure the next engineer can live in (STYLE.md, 19)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("pipeline", "guards", "wrappers", "integrations", "cli")
#: A module past this many lines is doing several jobs: split it by job.
MOST_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (lines := len(path.read_text("utf-8").splitlines())) > MOST_LINES
    }
    assert long == {}


def test_every_source_package_has_a_test_package() -> None:
    """Tests mirror the packages: ``tests/<package>/`` for each."""
    for package in PACKAGES:
        assert (ROOT / "tests" / package / "__init__.py").exists(), package
