"""Optional dependencies, imported when first used, with an error that says what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str) -> ModuleType:
    """``import module``, or an ``ImportError`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"this needs the {module!r} package: pip install 'guardstack[{extra}]'",
            name=module,
        ) from error
