"""Virtual time for asyncio, the way trio's ``MockClock(autojump_threshold=0)`` does it.

When the loop has nothing ready to run and only timers to wait for, the clock jumps
straight to the next timer instead of sleeping, so a 30-second scenario runs in
microseconds of wall time and every timestamp is exact. It never jumps while
callbacks are ready, so ordering is the same as on a real clock.

Worker threads are real: while one runs, the loop blocks in ``select`` waiting
for its completion, and jumps only if a timer is due before the thread reports
back — which is what trio's autojump does too. (anyio's ``to_thread`` — how
guardstack runs a plain-function tool — is such a thread: a hung blocking tool
still meets its budget.)

Work handed to ``loop.run_in_executor`` is the exception: the clock stands still
until it reports back. Frameworks hop to the executor for their own bookkeeping
(LangSmith's ``traceable`` does around every LangChain middleware hook); in virtual
time that bookkeeping takes no time, as it takes next to none in real time,
instead of letting every pending timer fire while it runs.
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
        self._in_executor = 0

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Any, *args: Any
    ) -> asyncio.Future[Any]:
        future = super().run_in_executor(executor, func, *args)
        self._in_executor += 1
        future.add_done_callback(self._executor_done)
        return future

    def _executor_done(self, future: asyncio.Future[Any]) -> None:
        self._in_executor -= 1

    async def shutdown_default_executor(self, *args: Any) -> None:
        # Joining the worker threads takes real time: the clock must not jump past the
        # timeout Python 3.12+ gives it (300 s) while they finish.
        self._in_executor += 1
        try:
            await super().shutdown_default_executor(*args)
        finally:
            self._in_executor -= 1

    def time(self) -> float:
        return self._virtual_now

    def _run_once(self) -> None:
        scheduled: list[Any] = self._scheduled  # type: ignore[attr-defined]
        ready = self._ready  # type: ignore[attr-defined]
        if not ready and scheduled and not self._in_executor and not self._has_pending_io():
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


def jump_clock(seconds: float) -> None:
    """Move the virtual clock on (asyncio's above, or trio's ``MockClock``) without
    yielding: a deadline passes while the current task runs, as under a busy tool."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio
        import trio.lowlevel
        from trio.testing import MockClock

        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, MockClock)
        clock.jump(seconds)
        return
    assert isinstance(loop, VirtualTimeEventLoop)
    loop._virtual_now += seconds
