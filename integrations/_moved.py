"""The gateway's modules that lived in ``guardstack.integrations`` until 0.2 and live in
``guardstack.gateway`` now: a name read through the old path warns until 0.3
(docs/releases.md). Imported by name at run time, so ``integrations`` still imports
nothing of ``gateway`` (the import contract)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["moved"]


def moved(old: str, new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old``: each name is ``new``'s, with a warning."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        found = getattr(importlib.import_module(new), name)
        warnings.warn(
            f"{old} is deprecated in 0.2 and removed in 0.3: the gateway is its own "
            f"package; import {name} from {new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return found

    return __getattr__
