"""``--watch``: reload a running service's stack when its configuration file changes.

The file is looked at every ``interval_s`` (its modification time and size, then its
bytes); a change is loaded with ``Harness.reload`` and ``guardstack check``. A file
that does not load — or is half-written when read — changes nothing: one line on
standard error says why (file, plugin, key, value), and the service goes on with the
stack it has until the next change. Check's warnings are printed; they never stop a
reload.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import TextIO

import anyio

from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness

__all__ = ["watch_config"]


def _fingerprint(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


async def watch_config(
    harness: Harness,
    path: Path,
    *,
    allow_imports: bool = False,
    interval_s: float = 1.0,
    say: TextIO | None = None,
) -> None:
    """Reload ``harness`` from ``path`` whenever its contents change, until cancelled."""
    from guardstack.cli.check import check

    out = say if say is not None else sys.stderr
    seen = _fingerprint(path)
    while True:
        await anyio.sleep(interval_s)
        now = _fingerprint(path)
        if now is None or now == seen:
            continue
        seen = now
        try:
            reloaded = harness.reload(path, allow_imports=allow_imports, check=check)
        except ConfigError as error:
            print(
                f"guardstack: {path} not reloaded, the stack is unchanged: {error}",
                file=out,
                flush=True,
            )
            continue
        print(
            f"guardstack: {path} reloaded: stack version {reloaded.version} "
            f"({', '.join(reloaded.plugins) or 'no plugins'})",
            file=out,
            flush=True,
        )
        for warning in reloaded.warnings:
            print(f"guardstack: warning: {warning}", file=out, flush=True)
