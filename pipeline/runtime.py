"""anyio's clock, cancel check and cancel scopes on the hot path, asked of the loop directly.

``anyio.current_time()``, ``anyio.current_effective_deadline()`` and
``anyio.CancelScope()`` find the running backend on every call (sniffio, then a
table) before they ask it, and on asyncio each step looks the running loop up again
(on Python 3.11 every lookup is a ``getpid`` system call); a new ``CancelScope`` is
also initialised twice. Every guarded call makes a scope and asks the clock and the
cancel state, so on asyncio — where nearly every user runs — this module asks the
running loop once: its clock, the current task's cancel scopes read the way anyio's
asyncio backend reads them in its own ``checkpoint_if_cancelled``, and the backend's
own ``CancelScope`` class, which is what ``anyio.CancelScope()`` returns there.
Anywhere else (trio, or trio code running as an asyncio guest, where the current
task is no asyncio task) the public anyio calls answer.

Reading anyio's asyncio internals is checked once, at import, and anything
unexpected falls back to the public calls for good; tests hold every answer equal
to the public one over random nestings of cancelled, shielded and expiring scopes,
on asyncio and trio. (STYLE's "only anyio for time and cancellation" still holds:
these are anyio's own scopes and clock, found without the lookup.)

**What asking the public calls instead would cost** (DESIGN: private reads stay only
above 5 % on ``benchmarks.overhead``; ``--public-anyio`` against none, three runs of three
each, 2026-12-06): an empty ``registry.execute`` 2,360–2,390 → 3,320–3,350 ns (+39 %; from
23x a bare await to 32x, against a 25x goal), ten pass-through layers +24–29 %; the model
stage is unchanged (≈700 ns), as it makes no scope of its own.
"""

from __future__ import annotations

import math
import os
import sys
from asyncio import BaseEventLoop, current_task
from asyncio.events import _get_running_loop
from threading import get_ident
from typing import Any
from weakref import ref

import anyio
import anyio.lowlevel

__all__ = ["cancel_pending", "cancel_scope", "deliver_pending", "now", "scope_after"]


def _asyncio_backend() -> tuple[Any, Any]:
    """anyio's asyncio task table (task -> state) and its ``CancelScope`` class, if they
    still look the way they are used here; else ``(None, None)``."""
    try:
        from anyio._backends import _asyncio as backend

        scope = backend.CancelScope(deadline=math.inf)
        for attribute in ("_cancel_called", "_deadline", "_shield", "_parent_scope"):
            getattr(scope, attribute)
        states = vars(backend._task_states)["data"]  # the dict under the WeakKeyDictionary
        states.get  # noqa: B018
        if not isinstance(scope, anyio.CancelScope):
            raise TypeError  # noqa: TRY301
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - an anyio that changed
        return None, None
    return states, backend.CancelScope


_STATES, _SCOPE = _asyncio_backend()

_task_of: Any = current_task
if sys.version_info < (3, 12):  # current_task is a Python function here; its table is not
    import asyncio.tasks

    _task_of = vars(asyncio.tasks)["_current_tasks"].get


#: The asyncio loop last found running. It still runs in this thread while its
#: ``_thread_id`` is this thread's (asyncio runs one loop per thread at a time): the
#: check asks no system call, where ``asyncio.get_running_loop()`` asks ``getpid``
#: on Python 3.11. Forgotten in a forked child.
_last_loop: Any = None


def _running_loop() -> Any:
    """The running asyncio loop, or ``None`` (trio, or no loop)."""
    global _last_loop
    loop = _last_loop
    if loop is not None and loop._thread_id == get_ident():
        return loop
    loop = _get_running_loop()
    _last_loop = loop if isinstance(loop, BaseEventLoop) else None  # uvloop: not cached
    return loop


def _forget_loop() -> None:
    global _last_loop
    _last_loop = None


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_loop)


def now() -> float:
    """``anyio.current_time()``: the running event loop's clock."""
    loop = _running_loop()
    return loop.time() if loop is not None else anyio.current_time()


def _asyncio_task_loop() -> Any:
    """The running loop when the current task is an asyncio task whose scopes can be made
    here (``None``: trio, a guest, or an anyio this module does not know)."""
    loop = _running_loop()
    if loop is None or _SCOPE is None or _task_of(loop) is None:
        return None
    return loop


def cancel_scope(deadline: float = math.inf) -> anyio.CancelScope:
    """``anyio.CancelScope(deadline=deadline)``: on asyncio, its backend's class directly."""
    made = anyio.CancelScope if _asyncio_task_loop() is None else _SCOPE
    return made(deadline=deadline)


def scope_after(seconds: float) -> tuple[anyio.CancelScope, float]:
    """A cancel scope whose deadline is ``seconds`` from now, and now: ``cancel_scope(
    now() + seconds)`` with the loop looked up once."""
    loop = _asyncio_task_loop()
    if loop is None:
        started = anyio.current_time()
        return anyio.CancelScope(deadline=started + seconds), started
    started = loop.time()
    return _SCOPE(deadline=started + seconds), started


def cancel_pending() -> bool:
    """Whether the current task is cancelled, or an enclosing deadline has passed, and
    the cancellation waits for its next checkpoint: ``await anyio.lowlevel.checkpoint()``
    then delivers it. A shielded scope hides what is outside it, as it does in anyio."""
    loop = _running_loop()
    task = _task_of(loop) if loop is not None and _STATES is not None else None
    if task is None:  # not an asyncio task: trio, or trio as an asyncio guest
        deadline = anyio.current_effective_deadline()
        return deadline != math.inf and deadline <= anyio.current_time()
    state = _STATES.get(ref(task))
    scope = state.cancel_scope if state is not None else None
    while scope is not None:
        if scope._cancel_called:
            return True
        deadline = scope._deadline
        if deadline != math.inf and deadline <= loop.time():
            return True
        if scope._shield:
            return False
        scope = scope._parent_scope
    return False


async def deliver_pending() -> None:
    """Let a pending cancel (``cancel_pending``) arrive before going on; return if none.

    One checkpoint delivers a cancelled scope's cancel. A deadline that passed while
    the task ran is different on asyncio: its timer is queued behind the task's own
    wake-up, so the first checkpoint resumes the task before the timer has cancelled
    anything, and the second delivers it. (Three at most: a scope whose timer never
    fires lets the caller go on rather than spin.)
    """
    for _ in range(3):
        if not cancel_pending():
            return
        await anyio.lowlevel.checkpoint()
