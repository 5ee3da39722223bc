"""The clock and the cancel check on the hot path, without anyio's per-call dispatch.

``anyio.current_time()`` and ``anyio.current_effective_deadline()`` find the running
backend on every call (sniffio, then a table) before they ask it, and on asyncio
each step looks the running loop up again (on Python 3.11 every lookup is a
``getpid`` system call). Every guarded call asks both, so on asyncio — where nearly
every user runs — each is asked once of the running loop directly: its clock, and
the current task's cancel scopes read the way anyio's asyncio backend reads them in
its own ``checkpoint_if_cancelled``. Anywhere else (trio, or trio code running as an
asyncio guest) the public anyio calls answer.

Reading anyio's asyncio task table is reading its internals, so it is checked once,
at import, and anything unexpected falls back to the public calls for good; a test
holds both answers equal over nested, shielded, cancelled and expired scopes.
"""

from __future__ import annotations

import math
import sys
from asyncio import current_task
from asyncio.events import _get_running_loop
from typing import Any
from weakref import ref

import anyio

__all__ = ["cancel_pending", "now"]


def _asyncio_task_states() -> Any:
    """anyio's asyncio task table (task -> state), if it still looks the way it is read here."""
    try:
        from anyio._backends import _asyncio as backend

        scope = backend.CancelScope()
        for attribute in ("_cancel_called", "_deadline", "_shield", "_parent_scope"):
            getattr(scope, attribute)
        states = backend._task_states.data
        states.get  # noqa: B018 - a dict underneath the WeakKeyDictionary
    except (ImportError, AttributeError):  # pragma: no cover - an anyio that changed
        return None
    return states


_STATES = _asyncio_task_states()

if sys.version_info < (3, 12):  # current_task is a Python function here; its table is not
    from asyncio.tasks import _current_tasks

    _task_of = _current_tasks.get
else:
    _task_of = current_task


def now() -> float:
    """``anyio.current_time()``: the running event loop's clock."""
    loop = _get_running_loop()
    return loop.time() if loop is not None else anyio.current_time()


def cancel_pending() -> bool:
    """Whether the current task is cancelled, or an enclosing deadline has passed, and
    the cancellation waits for its next checkpoint: ``await anyio.lowlevel.checkpoint()``
    then delivers it. A shielded scope hides what is outside it, as it does in anyio."""
    loop = _get_running_loop()
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
        if deadline != math.inf and deadline <= loop.time():  # type: ignore[union-attr]
            return True
        if scope._shield:
            return False
        scope = scope._parent_scope
    return False
