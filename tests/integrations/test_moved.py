"""The gateway's old import paths (``guardstack.integrations.model_proxy`` and the rest,
until 0.2) still answer — each name with a ``DeprecationWarning`` naming where it lives
now — and ``integrations`` imports nothing of ``gateway`` to do it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

MOVED = {
    "model_proxy": "ModelProxy",
    "mcp_gateway": "Gateway",
    "budgets": "Budgets",
    "tenants": "read_tenants",
    "decision_log": "DecisionLog",
    "spend": "spend_report",
}


@pytest.mark.parametrize(("module", "name"), MOVED.items())
def test_an_old_path_warns_and_gives_the_gateways_own(module: str, name: str) -> None:
    old = importlib.import_module(f"guardstack.integrations.{module}")
    new = importlib.import_module(f"guardstack.gateway.{module}")
    with pytest.warns(DeprecationWarning, match=f"import {name} from guardstack.gateway.{module}"):
        found = getattr(old, name)
    assert found is getattr(new, name)


def test_an_old_path_knows_no_name_its_new_home_lacks() -> None:
    old = importlib.import_module("guardstack.integrations.tenants")
    with pytest.raises(AttributeError):
        old.NoSuchName  # noqa: B018


def test_integrations_import_nothing_of_the_gateway() -> None:
    """The old paths find the gateway by name at run time: no import statement in
    ``integrations/`` names it (the import contract checks the same in CI)."""
    root = Path(__file__).parents[2] / "integrations"
    naming = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "import guardstack.gateway" in path.read_text("utf-8")
        or "from guardstack.gateway" in path.read_text("utf-8")
    ]
    assert naming == []
