"""The values a budget's reservation is made of: the scopes a request counts in
(``BudgetScope``), a window it would pass (``BudgetRefusal``, whose message is what the
client is told), and what it holds until settled (``Held``); and the spend report's
names. Shared by ``budgets`` (the engine), ``budget_operators`` and ``spend``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from guardstack.gateway.tenants import Budget, KeyEntry

__all__ = ["REPORTED", "SPEND", "BudgetRefusal", "BudgetScope", "Held"]

SPEND: Final = "spend"
#: Report windows: the periods spend is summed by.
REPORTED: Final = ("day", "month")


@attrs.frozen
class BudgetScope:
    """One scope a request belongs to: its kind, its id parts and its label."""

    kind: str  # tenant, team, key, conversation
    parts: tuple[str, ...]
    label: str
    budget: Budget


@attrs.frozen
class BudgetRefusal:
    """A budget that would be passed: who, which window, and when it ends."""

    scope: BudgetScope
    window: str
    used: float
    limit: float
    retry_after_s: float | None
    #: What this request would have reserved in the window (its estimate).
    reserving: float = 0.0

    @property
    def message(self) -> str:
        measure, _, per = self.window.partition("_per_")
        when = f"this {per}" if per else "in all"
        if measure == "usd":
            amounts = f"{_money(self.used)} of its {_money(self.limit)}"
            reserving = _money(self.reserving)
        else:
            amounts = f"{self.used:,.0f} of its {self.limit:,.0f} {measure}"
            reserving = f"{self.reserving:,.0f} {measure}"
        said = f"{self.scope.kind} {self.scope.label!r} has used {amounts} {when}"
        if self.used < self.limit:  # not spent: this request's estimate is what passes it
            said += f"; this request's reservation of {reserving} would pass it"
        return said


@attrs.frozen
class Held:
    """A request's reservation: its operation, the scopes it counted in, and what it
    reserved (to settle, or to give back)."""

    op_id: str
    scopes: tuple[BudgetScope, ...]
    model: str
    estimate: Mapping[str, float]
    entry: KeyEntry
    conversation: str = ""
    #: Whose prices the model is looked up at (``prices.PROVIDERS``), if known.
    provider: str | None = None

    def about(self) -> dict[str, str | None]:
        """Who the request is: what a decision about it (an alert) names."""
        entry = self.entry
        return {"tenant": entry.tenant, "team": entry.team, "key_name": entry.id,
                "conversation": self.conversation or None, "model": self.model}  # fmt: skip


def _money(amount: float) -> str:
    """Dollars as people write them: cents, or four places under a dollar."""
    return f"${amount:,.2f}" if amount >= 1 or amount == 0 else f"${amount:.4f}"
