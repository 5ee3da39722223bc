"""The line of calls waiting at an admission layer: priority first, then fair shares.

Every admission layer (``ConcurrencyLimit``, ``AdaptiveConcurrencyLimit``,
``RateLimit``, ``TokenRateLimit``) keeps one line per key of the calls that could not
get in at once. Only the call at the head of the line asks the store for a slot or a
token; when any call leaves (admitted, refused, timed out or cancelled) the line's
head — whichever call that is now — is woken and asks. (Admitting a call changes the
served counts that choose the head, so the call that leaves need not have been the
head when it left: the line wakes its head every time rather than guess. So does a
tenant's joining, when it moves that tenant's count: the count is one per tenant
across priorities.) Which call is the head:

* **Priority first.** A call's priority (``ToolCall.priority``,
  ``ModelRequest.priority``, else its agent's; 0 by default) orders the line, higher
  first: no call waits behind one of a lower priority. Within a priority, calls go
  first come, first served.
* **Fair shares** (``fair=True``, or a mapping of tenant to weight). Within a
  priority, tenants take weighted turns instead of arrival order (start-time fair
  queueing): each tenant's *served* count grows by ``1 / weight`` with every call of
  its own admitted, and the head is the first waiter of the tenant served least. A
  tenant that starts waiting is put level with the least-served tenant still
  waiting, so one that was idle gets no burst of turns and one that floods the line
  gets no more than its share: between two admissions of a waiting tenant, every
  other tenant is admitted at most ``ceil(its weight / the waiting tenant's)`` times.
  Within a tenant, first come, first served.

The line lives in this process (a shared store shares the slots or tokens, not the
line); it costs nothing while nobody waits.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from typing import Final

import anyio

__all__ = ["FIFO", "Fairness", "WaitLine", "Waiter", "fairness"]

#: ``fair=`` as a layer keeps it: ``None`` (first come, first served within a
#: priority) or each tenant's weight (``{}``: every tenant weighs 1).
Fairness = Mapping[str, float] | None
FIFO: Final[Fairness] = None
#: How many tenants a line remembers the served count of, once none of them waits.
_MAX_REMEMBERED: Final = 10_000


class Waiter:
    """One call in the line: woken (``event``) when it becomes the head."""

    __slots__ = ("event", "number", "priority", "tenant")

    def __init__(self, number: int, priority: int, tenant: str) -> None:
        self.event = anyio.Event()
        self.number = number
        self.priority = priority
        self.tenant = tenant


class _Level:
    """The waiters of one priority: one queue, or a queue per tenant when fair."""

    __slots__ = ("queues",)

    def __init__(self) -> None:
        self.queues: dict[str, deque[Waiter]] = {}


class WaitLine:
    """The waiters for one key (see the module docstring)."""

    __slots__ = ("_count", "_last", "_levels", "_numbers", "_served", "_top", "weights")

    def __init__(self, weights: Fairness = FIFO) -> None:
        #: Each tenant's weight when the line is fair; ``None``: first come, first served.
        self.weights = weights
        self._levels: dict[int, _Level] = {}
        self._top: int | None = None  # the highest priority that has waiters
        self._count = 0
        self._numbers = itertools.count()
        #: Per tenant: how much it has been served (fair lines only), and when it was last
        #: (an admission's number): of two tenants served alike, the one served longer ago
        #: goes first, so tenants alternate.
        self._served: dict[str, float] = {}
        self._last: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    def join(self, priority: int, tenant: str) -> Waiter:
        """Put a call in line; it is the head at once if nobody goes before it."""
        waiter = Waiter(next(self._numbers), priority, tenant)
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Level()
            if self._top is None or priority > self._top:
                self._top = priority
        lane = tenant if self.weights is not None else ""
        queue = level.queues.get(lane)
        caught_up = False
        if queue is None:
            queue = level.queues[lane] = deque()
            if self.weights is not None:
                caught_up = self._catch_up(lane)
        queue.append(waiter)
        self._count += 1
        if caught_up:
            # The tenant's count is one across priorities: moving it level may have put
            # another tenant's waiter at the head of the top priority. Wake that one.
            self.wake_head()
        return waiter

    def head(self) -> Waiter | None:
        """The call that asks next: the highest priority's first (fairly chosen)."""
        top = self._top
        if top is None:
            return None
        queues = self._levels[top].queues
        if self.weights is None or len(queues) == 1:
            return next(iter(queues.values()))[0]
        served, last = self._served, self._last
        return min(
            (queue[0] for queue in queues.values()),
            key=lambda waiter: (
                round(served.get(waiter.tenant, 0.0), 9),  # sums of 1/weight are inexact
                last.get(waiter.tenant, -1),
                waiter.number,
            ),
        )

    def admitted(self, waiter: Waiter) -> None:
        """Count the admission of ``waiter``'s call against its tenant's share."""
        weights = self.weights
        if weights is not None:
            weight = weights.get(waiter.tenant, 1.0)
            self._served[waiter.tenant] = self._served.get(waiter.tenant, 0.0) + 1.0 / weight
            self._last[waiter.tenant] = next(self._numbers)

    def leave(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out of the line (admitted or not) and wake the line's head,
        whoever it is now; whether ``waiter`` was the head when it left."""
        was_head = self.head() is waiter
        level = self._levels[waiter.priority]
        lane = waiter.tenant if self.weights is not None else ""
        queue = level.queues[lane]
        queue.remove(waiter)
        self._count -= 1
        if not queue:
            del level.queues[lane]
            if self.weights is not None:
                self._forget(lane)
            if not level.queues:
                del self._levels[waiter.priority]
                self._top = max(self._levels) if self._levels else None
        self.wake_head()
        return was_head

    def wake_head(self) -> None:
        """Tell the head it may ask now (a head already asking just asks again later)."""
        head = self.head()
        if head is not None:
            head.event.set()

    def _waiting_tenants(self) -> list[str]:
        return [lane for level in self._levels.values() for lane in level.queues]

    def _least_served(self, exclude: str | None = None) -> float | None:
        served = self._served
        values = [served.get(t, 0.0) for t in self._waiting_tenants() if t != exclude]
        return min(values) if values else None

    def _catch_up(self, tenant: str) -> bool:
        """A tenant that starts waiting starts level with the least served one waiting;
        whether that moved its count."""
        least = self._least_served(exclude=tenant)
        if least is not None and self._served.get(tenant, 0.0) < least:
            self._served[tenant] = least
            return True
        return False

    def _forget(self, tenant: str) -> None:
        """Once a tenant stops waiting, its count matters only while it is ahead."""
        if tenant in self._waiting_tenants():
            return
        least = self._least_served()
        if least is None or self._served.get(tenant, 0.0) <= least:
            self._served.pop(tenant, None)
        if len(self._last) > _MAX_REMEMBERED:
            self._served.clear()  # the counts only order tenants; starting level is fair
            self._last.clear()


def fairness(plugin: str, value: object) -> Fairness:
    """``fair=``: ``False`` (first come, first served), ``True`` (every tenant weighs 1)
    or a mapping of tenant name to a weight > 0."""
    from guardstack.pipeline.validate import invalid

    if value is False or value is None:
        return FIFO
    if value is True:
        return {}
    if isinstance(value, Mapping):
        weights: dict[str, float] = {}
        for tenant, weight in value.items():
            if not isinstance(tenant, str) or not tenant:
                raise invalid(plugin, "fair", value, "tenant names (text) mapped to weights")
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not weight > 0
                or weight == float("inf")
            ):
                raise invalid(plugin, f"fair.{tenant}", weight, "a weight > 0")
            weights[tenant] = float(weight)
        return weights
    raise invalid(plugin, "fair", value, "True, False, or a mapping of tenant to weight")
