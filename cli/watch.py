"""``--watch``: reload a running service's stack when its configuration file changes.

The file is looked at every ``interval_s`` (a digest of its bytes); a change is
loaded with ``Harness.reload`` and ``guardstack check`` once the file has stopped
changing — it must read the same twice, ``settle_s`` apart, as an editor that writes
a file in parts leaves it. A file that does not load changes nothing: one line on
standard error says why (file, plugin, key, value), and the service goes on with the
stack it has until the next change. So does a file with nothing in it — empty, only
blanks or only comments, which is how most editors' saves begin (truncate, then
write): it would otherwise drop every cap until the next look. A stack with no
plugins at all is written ``[]``. Check's warnings are printed; they never stop a
reload.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import anyio

from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness

__all__ = ["watch_config", "watch_file"]


def _fingerprint(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _holds_nothing(path: Path) -> bool:
    """Whether the file says nothing at all: empty, blanks, or only comments."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    return all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines())


async def _settled(path: Path, seen: str | None, settle_s: float) -> str | None:
    """The file's digest once two reads ``settle_s`` apart agree (``None``: unreadable)."""
    while True:
        await anyio.sleep(settle_s)
        again = _fingerprint(path)
        if again == seen:
            return seen
        seen = again


async def watch_file(
    path: Path,
    reload: Callable[[Path], Sequence[str]],
    *,
    interval_s: float = 1.0,
    settle_s: float | None = None,
    say: TextIO | None = None,
    what: str = "the stack",
    empty: str = "write `[]` for a stack with no plugins",
) -> None:
    """Call ``reload(path)`` whenever the file's contents change (and have settled),
    until cancelled: it returns the lines to say, or raises ``ConfigError`` — said in
    one line, and ``what`` is unchanged. A file with nothing in it is never loaded."""
    out = say if say is not None else sys.stderr
    settle = settle_s if settle_s is not None else min(0.2, interval_s / 5)
    seen = _fingerprint(path)
    while True:
        await anyio.sleep(interval_s)
        now = _fingerprint(path)
        if now is None or now == seen:
            continue
        now = await _settled(path, now, settle)
        if now is None or now == seen:
            continue
        seen = now
        if _holds_nothing(path):
            print(
                f"guardstack: {path} not reloaded, {what} is unchanged: the file is empty "
                f"(half-written?); {empty}",
                file=out,
                flush=True,
            )
            continue
        try:
            lines = reload(path)
        except ConfigError as error:
            said = f"guardstack: {path} not reloaded, {what} is unchanged: {error}"
            print(said, file=out, flush=True)
            continue
        for line in lines:
            print(f"guardstack: {line}", file=out, flush=True)


async def watch_config(
    harness: Harness,
    path: Path,
    *,
    allow_imports: bool = False,
    interval_s: float = 1.0,
    settle_s: float | None = None,
    say: TextIO | None = None,
    after: Callable[[], Sequence[str]] | None = None,
) -> None:
    """Reload ``harness`` from ``path`` whenever its contents change, until cancelled;
    a change is read again ``settle_s`` later (default: a fifth of ``interval_s``, at
    most 0.2 s) and loaded only once it reads the same. ``after()``, once a reload took,
    brings what the service built from the stack up to date (the lines it returns are
    said)."""
    from guardstack.cli.check import check

    def reload(path: Path) -> list[str]:
        reloaded = harness.reload(path, allow_imports=allow_imports, check=check)
        plugins = ", ".join(reloaded.plugins) or "no plugins"
        return [
            f"{path} reloaded: stack version {reloaded.version} ({plugins})",
            *(f"warning: {warning}" for warning in reloaded.warnings),
            *(after() if after is not None else ()),
        ]

    await watch_file(path, reload, interval_s=interval_s, settle_s=settle_s, say=say)
