"""Virtual time for asyncio, the way trio's ``MockClock(autojump_threshold=0)`` does it.

When the loop has nothing ready to run and only timers to wait for, the clock jumps
straight to the next timer instead of sleeping, so a 30-second scenario runs in
microseconds of wall time and every timestamp is exact. It never jumps while
callbacks are ready, so ordering is the same as on a real clock.

Worker threads are real: while one runs, the loop blocks in ``select`` waiting
for its completion, and jumps only if a timer is due before the thread reports
back — which is what trio's autojump does too.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class VirtualTimeEventLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self._virtual_now = 0.0
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual_now

    def _run_once(self) -> None:
        scheduled: list[Any] = self._scheduled  # type: ignore[attr-defined]
        ready = self._ready  # type: ignore[attr-defined]
        if not ready and scheduled and not self._has_pending_io():
            earliest = min(
                (handle for handle in scheduled if not handle._cancelled),
                key=lambda handle: handle._when,
                default=None,
            )
            if earliest is not None and earliest._when > self._virtual_now:
                self._virtual_now = earliest._when
        super()._run_once()  # type: ignore[misc]

    def _has_pending_io(self) -> bool:
        # Jump only if no file descriptor has data right now (a worker thread's
        # result arrives through the self-pipe).
        events = self._selector.select(0)  # type: ignore[attr-defined]
        for key, mask in events:
            self._process_events([(key, mask)])  # type: ignore[attr-defined]
        return bool(events) or bool(self._ready)  # type: ignore[attr-defined]
