"""The names ``guardstack.pipeline`` exported in 0.1 that are for plugin authors, and
where they live now: importing one from the package warns until 0.3 (docs/releases.md)."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    **dict.fromkeys(
        ("DispatchNext", "ModelNext", "PostNext", "PreNext", "PromptNext"),
        "guardstack.pipeline.plugin",
    ),
    **dict.fromkeys(
        ("Execute", "Instrumentation", "Layer", "LayerInfo"), "guardstack.pipeline.contract"
    ),
}


def __getattr__(name: str) -> Any:
    """``guardstack.pipeline``'s module ``__getattr__``: a moved name, with a warning."""
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'guardstack.pipeline' has no attribute {name!r}")
    warnings.warn(
        f"guardstack.pipeline.{name} is deprecated in 0.2 and removed in 0.3: it is for "
        f"plugin authors; import it from {home}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)
