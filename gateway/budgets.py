"""Budgets a team runs on: every scope's windows, reserved at once, changed while running.

A request belongs to scopes — its tenant, its key's team, its key, its conversation —
and each scope may have a budget (``tenants.Budget``: windows and amounts). Before the
request goes upstream its estimate (the input at a token per four characters, the
output it may produce, in dollars at the model's price, and one request) is reserved
in **every window of every scope in one ledger operation, all or none**; after, the
reservation is settled at what the upstream reported. So requests at once pass a scope
by at most their estimates' error — none when each estimate is at least its cost. A
refusal names the scope and the window — ``team 'acme/ci' has used $20.00 of its
$20.00 this day`` — and when it ends (``Retry-After``).

**Changed while running.** A scope's budget set at ``PUT /admin/budgets/{scope}``, and
keys issued at ``POST /admin/keys`` (stored hashed: a digest, never the key) or revoked,
live in the store as controls: every process reads them again within ``refresh_s``
(one second). A conversation stopped by a budget goes on once the budget is raised.

**Reports.** Each request also counts, with no limit, in day and month report windows
named by tenant, team, key, model and conversation (``spend:…`` keys in the ledger),
which ``/admin/spend`` and ``guardstack spend`` sum ``by`` any of them.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from opentelemetry import trace

from guardstack.gateway.budget_operators import BudgetOperators, UnknownScope
from guardstack.gateway.budget_values import (
    REPORTED,
    SPEND,
    BudgetRefusal,
    BudgetScope,
    Held,
)
from guardstack.gateway.prices import maintained_price
from guardstack.gateway.tenants import (
    NO_BUDGET,
    Budget,
    KeyEntry,
    Tenants,
    key_digest,
    read_budget,
)
from guardstack.guards.usage_costs import Price, cost_of
from guardstack.guards.wrap_up import kept_aside_usd
from guardstack.pipeline.contract import Usage, Window, new_token, store_key
from guardstack.pipeline.decisions import decided
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.ledger import calendar_window as period
from guardstack.pipeline.signals import BUDGET_REMAINING_USD, SPEND_USD, Signals

__all__ = ["BudgetRefusal", "BudgetScope", "Budgets", "Held", "UnknownScope", "period"]

logger = logging.getLogger("guardstack")
#: How many (scope, window) pairs the remaining-budget gauge reports at most.
MAX_GAUGED: Final = 10_000

OWNER: Final = "budgets"
#: How long an operator's change takes to reach every process, at most.
REFRESH_S: Final = 1.0
#: A calendar window's entry outlives its end by this much.
GRACE_S: Final = 3_600.0


class Budgets(BudgetOperators):
    """The scopes' budgets over ``store`` (a ``Ledger`` with controls); what operators
    do to them (``BudgetOperators``: keys, budgets, spend) comes with them."""

    def __init__(
        self,
        tenants: Tenants,
        store: Any,
        *,
        prices: Mapping[str, Price] | None = None,
        wall_clock: Callable[[], float] | None = None,
        signals: Signals | None = None,
        stack_prices: Mapping[str, Price] | None = None,
    ) -> None:
        self.tenants = tenants
        self.signals = signals
        self.store = store
        #: What the guard stack's own ``usage-limit`` prices (one budget engine: the
        #: report prices what it charged); the tenants file's prices win.
        self.stack_prices = dict(stack_prices or {})
        self.prices = {**self.stack_prices, **dict(prices or tenants.prices or {})}
        #: Models charged at the fallback price (each named once in the decision log).
        self.unpriced: set[str] = set()
        self.wall_clock = wall_clock or time.time
        #: Operators' budgets by scope (``tenant:acme``…) and issued keys by digest.
        self.overrides: dict[str, Budget] = {}
        self.issued: dict[str, KeyEntry] = {}
        self.revoked: set[str] = set()
        self._read_at = -math.inf
        #: What this process's requests in flight hold, by (scope kind, parts).
        self.in_flight: dict[str, Held] = {}
        #: Alerts given, by window key (once per window).
        self._alerted: set[str] = set()
        #: What is left of each scope's dollar windows, by (scope, window), as last read
        #: (the ``guardstack.budget.remaining.usd`` gauge), and when each was read.
        self.remaining: dict[tuple[str, str], float] = {}
        self._remaining_read: dict[str, float] = {}
        if signals is not None:
            signals.gauge(BUDGET_REMAINING_USD, self._remaining_points)

    # -- what is configured --------------------------------------------------------------

    def replace(self, tenants: Tenants) -> None:
        """Serve a re-read tenants file from now on (``--watch``): its keys, budgets and
        prices. What was spent stays in the store; operators' changes stay on top."""
        self.tenants = tenants
        self.reprice(self.stack_prices)
        keys, names = len(tenants.keys), ", ".join(sorted(tenants.tenants)) or "none"
        decided("reload", layer="tenants", decision="reloaded", reason=f"{keys} keys; {names}")

    def reprice(self, stack_prices: Mapping[str, Price]) -> None:
        """The guard stack's ``usage-limit`` prices, re-read after a reload (``--watch``);
        the tenants file's prices still win."""
        self.stack_prices = dict(stack_prices)
        self.prices = {**self.stack_prices, **dict(self.tenants.prices or {})}

    async def refresh(self, *, force: bool = False) -> None:
        """Read the operators' changes again (at most every ``REFRESH_S``)."""
        now = self.wall_clock()
        if not force and now - self._read_at < REFRESH_S:
            return
        self._read_at = now
        try:
            stored = await self.store.read_controls()
        except Exception:
            logger.warning("budgets: the store did not answer; keeping what was read last")
            return
        overrides: dict[str, Budget] = {}
        issued: dict[str, KeyEntry] = {}
        revoked: set[str] = set()
        for name, text in stored.items():
            kind, _, rest = name.partition(":")
            try:
                value = json.loads(text)
                if kind == "budget":
                    overrides[rest] = read_budget(rest, value)
                elif kind == "key" and isinstance(value, dict):
                    if value.get("revoked"):
                        revoked.add(rest)
                        continue
                    issued[rest] = KeyEntry(
                        str(value["id"]),
                        str(value["tenant"]),
                        value.get("team"),
                        value.get("name"),
                        value.get("expires"),
                        read_budget("budget", value["budget"]) if value.get("budget") else None,
                    )
            except (ValueError, KeyError, TypeError, ConfigError):
                logger.warning("budgets: an unreadable record %r in the store was skipped", name)
        self.overrides, self.issued, self.revoked = overrides, issued, revoked

    def key(self, offered: str) -> KeyEntry | None:
        """The entry of a client key, if it is known, live and not revoked."""
        digest = key_digest(offered)
        entry = self.issued.get(digest)
        if entry is None:
            entry = self.tenants.keys.get(offered)
            if entry is not None and entry.id in self.revoked:
                return None
        if entry is None or entry.expired(self.wall_clock()):
            return None
        return entry

    def budget_of(self, kind: str, label: str, configured: Budget) -> Budget:
        return self.overrides.get(f"{kind}:{label}", configured)

    def scopes(self, entry: KeyEntry, conversation: str) -> tuple[BudgetScope, ...]:
        tenant = self.tenants.tenants.get(entry.tenant)
        configured = tenant.budget if tenant is not None else NO_BUDGET
        tenant_budget = self.budget_of("tenant", entry.tenant, configured)
        found = [BudgetScope("tenant", (entry.tenant,), entry.tenant, tenant_budget)]
        if entry.team is not None:
            label = f"{entry.tenant}/{entry.team}"
            team = tenant.teams.get(entry.team) if tenant else None
            configured = team.budget if team is not None else NO_BUDGET
            found.append(
                BudgetScope(
                    "team",
                    (entry.tenant, entry.team),
                    label,
                    self.budget_of("team", label, configured),
                )
            )
        own = (
            entry.budget
            if entry.budget is not None
            else self.budget_of("defaults", "key", self.tenants.key_default)
        )
        found.append(
            BudgetScope(
                "key", (entry.tenant, entry.id), entry.shown, self.budget_of("key", entry.id, own)
            )
        )
        conversation_budget = self.budget_of(
            "defaults", "conversation", self.tenants.conversation_default
        )
        found.append(
            BudgetScope(
                "conversation", (entry.tenant, conversation), conversation, conversation_budget
            )
        )
        return tuple(found)

    def allowed(self, entry: KeyEntry, model: str | None) -> bool:
        return self.models_allowed(entry, model or "") is None

    def models_allowed(self, entry: KeyEntry, model: str) -> str | None:
        """``None`` when every scope of ``entry`` that lists models (its tenant, its team,
        the key itself; globs allowed) allows ``model``; else the models they allow."""
        tenant = self.tenants.tenants.get(entry.tenant)
        team = tenant.teams.get(entry.team) if tenant is not None and entry.team else None
        lists = [found.models for found in (tenant, team, entry) if found is not None]
        listed = [models for models in lists if models is not None]
        if all(any(fnmatch.fnmatchcase(model, glob) for glob in models) for models in listed):
            return None
        narrowest = min(listed, key=len)
        return ", ".join(sorted(narrowest))

    # -- windows ---------------------------------------------------------------------------

    def windows_of(
        self, scope: BudgetScope, now: float, *, wrap_up: bool = False
    ) -> list[tuple[str, Window, float]]:
        """The scope's windows: (its budget's name, the window, when it ends)."""
        found = []
        budget = scope.budget
        for name, amount in budget.limits.items():
            measure, _, per = name.partition("_per_")
            unit = measure
            limit = amount
            if measure == "usd" and budget.on_limit == "wrap_up" and not wrap_up:
                limit = max(0.0, amount - self.wrap_up_usd(budget))  # kept aside for it
            if per:
                period_name, _, end = period(now, per)
                key = store_key(OWNER, scope.kind, *scope.parts, name, period_name)
                found.append((name, Window(key, unit, limit, end - now + GRACE_S), end))
            else:
                key = store_key(OWNER, scope.kind, *scope.parts, name)
                found.append((name, Window(key, unit, limit), math.inf))
        return found

    def wrap_up_usd(self, budget: Budget) -> float:
        """What a wrap-up answer may cost: its tokens at the highest output price."""
        return kept_aside_usd(budget.wrap_up_tokens, self.prices)

    def _reports(self, entry: KeyEntry, conversation: str, model: str, now: float) -> list[Window]:
        found = []
        for kind in REPORTED:
            name, _, end = period(now, kind)
            # a month's rows by conversation would be one a conversation: days only
            who = conversation if kind == "day" else "-"
            for unit in ("usd", "tokens", "requests"):
                key = store_key(
                    SPEND,
                    kind,
                    name,
                    entry.tenant,
                    entry.team or "-",
                    entry.shown,
                    model,
                    who,
                    unit,
                )
                found.append(Window(key, unit, None, end - now + GRACE_S))
        return found

    def price(self, model: str, provider: str | None = None) -> Price:
        """``model``'s price: the file's, else the maintained table's (``prices``), else
        the highest the file's table holds — named once in the decision log."""
        found = self.prices.get(model)
        if found is not None:
            return found
        found = maintained_price(model, provider)
        if found is not None:
            return found
        if model not in self.unpriced:
            self.unpriced.add(model)
            decided(
                "unpriced",
                layer="budgets",
                decision="highest_price",
                reason=f"model {model!r} has no price in the file or in genai-prices: "
                "charged at the highest price the file holds",
                model=model,
            )
        table = list(self.prices.values()) or [(0.0, 0.0, 0.0, 0.0)]
        return tuple(max(p[i] for p in table) for i in range(4))  # type: ignore[return-value]

    # -- a request -------------------------------------------------------------------------

    async def reserve(
        self,
        entry: KeyEntry,
        conversation: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        *,
        wrap_up: bool = False,
        provider: str | None = None,
    ) -> Held | BudgetRefusal:
        """Reserve a request's estimate in every window of every scope, all or none."""
        now = self.wall_clock()
        scopes = self.scopes(entry, conversation)
        usage = Usage(input_tokens, output_tokens)
        estimate = {
            "usd": cost_of(usage, self.price(model, provider)),
            "tokens": float(input_tokens + output_tokens),
            "requests": 1.0,
        }
        windows: list[Window] = []
        ends: dict[str, tuple[BudgetScope, str, float]] = {}
        for scope in scopes:
            for name, window, end in self.windows_of(scope, now, wrap_up=wrap_up):
                windows.append(window)
                ends[window.key] = (scope, name, end)
        windows.extend(self._reports(entry, conversation, model, now))
        op_id = store_key(OWNER, "op", new_token())
        reservation = await self.store.reserve(op_id, estimate, windows)
        if not reservation.granted and reservation.window is not None:
            scope, name, end = ends[reservation.window.key]
            limit = scope.budget.limits[name]
            wait = end - now if math.isfinite(end) else None
            unit = reservation.window.unit
            return BudgetRefusal(
                scope, name, reservation.used, limit, wait, estimate.get(unit, 0.0)
            )
        held = self.in_flight[op_id] = Held(
            op_id, scopes, model, estimate, entry, conversation, provider
        )
        return held

    async def settle(
        self,
        held: Held,
        usage: Usage | None,
        model: str | None = None,
        *,
        at_least_reserved: bool = False,
    ) -> float:
        """Settle ``held`` at what the upstream reported (``None``: its reservation);
        what it cost. ``at_least_reserved``: an answer cut short — what it reported
        before the cut, unless its reservation is more (the provider may have billed
        the rest)."""
        self.in_flight.pop(held.op_id, None)
        cost = (
            cost_of(usage, self.price(model or held.model, held.provider))
            if usage is not None
            else 0.0
        )
        short = usage is not None and (
            cost < held.estimate["usd"] or usage.total_tokens < held.estimate["tokens"]
        )
        if usage is None or (at_least_reserved and short):
            await self.store.settle(held.op_id, {})
            return held.estimate["usd"]
        actual = {"usd": cost, "tokens": float(usage.total_tokens), "requests": 1.0}
        await self.store.settle(held.op_id, actual)
        if self.signals is not None:
            entry = held.entry
            who = {"tenant": entry.tenant, "team": entry.team or "", "key": entry.shown}
            self.signals.add(SPEND_USD, cost, {**who, "model": model or held.model})
        await self._after(held)
        return cost

    async def release(self, held: Held) -> None:
        """The request never reached the upstream: its reservation is given back."""
        self.in_flight.pop(held.op_id, None)
        await self.store.release(held.op_id)

    async def _after(self, held: Held) -> None:
        """After a request is settled: what is left of its scopes' windows, read again
        for the gauge (each at most every ``REFRESH_S``) and for a budget's ``alert_at``
        (once a window)."""
        now = self.wall_clock()
        for scope in held.scopes:
            alert_at = scope.budget.alert_at
            gauged = self.signals is not None and scope.kind != "conversation"
            if alert_at is None and not gauged:
                continue
            for name, window, _ in self.windows_of(scope, now):
                limit = scope.budget.limits[name]
                due = gauged and name.startswith("usd")
                due = due and now - self._remaining_read.get(window.key, -math.inf) >= REFRESH_S
                alerting = alert_at is not None and window.key not in self._alerted
                if window.limit is None or not (due or alerting):
                    continue
                try:
                    used = await self.store.balance(window)
                except Exception:
                    logger.debug("budgets: could not read %s", window.key, exc_info=True)
                    continue
                if due:
                    self._remaining_read[window.key] = now
                    self._remember(f"{scope.kind}:{scope.label}", name, limit - used)
                if alerting and alert_at is not None and used >= alert_at * limit:
                    self._alerted.add(window.key)
                    # once a window across every gateway process on the store
                    first, _ = await self.store.add(f"{window.key}:alerted", 1, limit=1)
                    if first:
                        self._alert(held, scope, name, used, limit, alert_at)

    def _remember(self, scope: str, window: str, left: float) -> None:
        remaining = self.remaining
        remaining.pop((scope, window), None)
        remaining[(scope, window)] = max(0.0, left)
        if len(remaining) > MAX_GAUGED:  # the least recently read go first
            del remaining[next(iter(remaining))]

    def _remaining_points(self) -> list[tuple[float, dict[str, str]]]:
        return [
            (left, {"scope": scope, "window": window})
            for (scope, window), left in list(self.remaining.items())
        ]

    def _alert(
        self, held: Held, scope: BudgetScope, name: str, used: float, limit: float, at: float
    ) -> None:
        """A budget past its ``alert_at``: a decision-log line and an OpenTelemetry event."""
        reason = (
            f"{scope.kind} {scope.label!r} has used {used:g} of {limit:g} ({name}), past {at:.0%}"
        )
        decided("budget_alert", layer="budgets", decision="alert", reason=reason, **held.about())
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(
                "guardstack.budget_alert",
                {"guardstack.scope": f"{scope.kind}:{scope.label}", "guardstack.window": name,
                 "guardstack.reason": reason},
            )  # fmt: skip
        if self.signals is not None:
            self.signals.event(
                "guardstack.budget_alert",
                {"guardstack.scope": f"{scope.kind}:{scope.label}", "guardstack.window": name,
                 "guardstack.reason": reason},
                "WARN",
            )  # fmt: skip
