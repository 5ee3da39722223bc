"""A reference model of nested budgets, and a hypothesis state machine that holds
``Budgets`` to it on a store: random requests into tenant → team → key → conversation
scopes, settled (at most their estimates), cancelled (given back), budgets raised,
keys revoked, and — where the store has a process — restarts.

Invariant: every scope's day holds what the model says, and no scope's day passes its
limit (each estimate is at least its cost, so the documented overshoot is nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from guardstack.gateway.budgets import BudgetRefusal, Budgets, Held
from guardstack.gateway.tenants import tenants_of
from tests.helpers import thread_loop

KEYS = {
    "sk-acme-alice-0123456789": ("acme", "research", "alice"),
    "sk-acme-bob-00123456789": ("acme", "research", "bob"),
    "sk-acme-ci-000123456789": ("acme", "ci", "ci"),
    "sk-globex-0000123456789": ("globex", None, "gx"),
}
LIMITS = {
    ("tenant", "acme"): 0.010,
    ("tenant", "globex"): 0.004,
    ("team", "acme/research"): 0.006,
    ("team", "acme/ci"): 0.003,
}
KEY_LIMIT = 0.0045  # every key's own day (defaults)
EPSILON = 1e-9


def tenants_file() -> dict[str, Any]:
    return {
        "keys": {
            key: {"tenant": tenant, "name": name, **({"team": team} if team else {})}
            for key, (tenant, team, name) in KEYS.items()
        },
        "tenants": {
            "acme": {
                "budget": {"usd_per_day": LIMITS[("tenant", "acme")]},
                "teams": {
                    "research": {"budget": {"usd_per_day": LIMITS[("team", "acme/research")]}},
                    "ci": {"budget": {"usd_per_day": LIMITS[("team", "acme/ci")]}},
                },
            },
            "globex": {"budget": {"usd_per_day": LIMITS[("tenant", "globex")]}},
        },
        "defaults": {"key": {"budget": {"usd_per_day": KEY_LIMIT}}},
        "prices": {"m": [0, 1]},  # $1 a million output tokens: tokens are micro-dollars
    }


def scopes_of(key: str) -> list[tuple[str, str]]:
    tenant, team, name = KEYS[key]
    found = [("tenant", tenant), ("key", f"{tenant}/{name}")]
    if team is not None:
        found.append(("team", f"{tenant}/{team}"))
    return found


class BudgetsMachine(RuleBasedStateMachine):
    """Subclass and set ``make_store`` (a store, and what restarts its process or
    ``None``)."""

    make_store: Callable[[], tuple[Any, Callable[[], None] | None]]
    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.store, self.restart = type(self).make_store()
        self.budgets = Budgets(tenants_of(tenants_file()), self.store)
        thread_loop().run(self.budgets.refresh(force=True))
        self.limits = dict(LIMITS)
        self.limits.update({("key", f"{t}/{name}"): KEY_LIMIT for t, _, name in KEYS.values()})
        self.values = dict.fromkeys(self.limits, 0.0)
        self.pending: dict[str, tuple[str, float]] = {}
        self.revoked: set[str] = set()
        self.restarts = 0

    def _fits(self, key: str, amount: float) -> bool:
        return all(
            self.values[scope] + amount <= self.limits[scope] + EPSILON for scope in scopes_of(key)
        )

    @rule(
        target=held,
        key=st.sampled_from(sorted(KEYS)),
        tokens=st.integers(0, 3_000),
        conversation=st.sampled_from(["c1", "c2"]),
    )
    def request(self, key: str, tokens: int, conversation: str) -> Any:
        entry = self.budgets.key(key)
        if key in self.revoked:
            assert entry is None
            return None
        assert entry is not None
        answer = thread_loop().run(self.budgets.reserve(entry, conversation, "m", 0, tokens))
        amount = tokens / 1_000_000
        fits = self._fits(key, amount)
        assert isinstance(answer, Held) == fits, (answer, self.values, key, amount)
        if isinstance(answer, BudgetRefusal):
            scope = (answer.scope.kind, answer.scope.label)
            assert self.values[scope] + amount > self.limits[scope] - EPSILON
            return None
        for scope in scopes_of(key):
            self.values[scope] += amount
        self.pending[answer.op_id] = (key, amount)
        return answer

    @rule(held=consumes(held), share=st.floats(0, 1))
    def settle(self, held: Any, share: float) -> None:
        if held is None:
            return
        from guardstack.pipeline.contract import Usage

        key, amount = self.pending.pop(held.op_id)
        tokens = int(amount * 1_000_000 * share)
        thread_loop().run(self.budgets.settle(held, Usage(0, tokens), "m"))
        for scope in scopes_of(key):
            self.values[scope] += tokens / 1_000_000 - amount

    @rule(held=consumes(held))
    def cancel(self, held: Any) -> None:
        if held is None:
            return
        key, amount = self.pending.pop(held.op_id)
        thread_loop().run(self.budgets.release(held))
        for scope in scopes_of(key):
            self.values[scope] -= amount

    @rule(scope=st.sampled_from(sorted(LIMITS)), more=st.sampled_from([0.001, 0.002]))
    def raise_budget(self, scope: tuple[str, str], more: float) -> None:
        self.limits[scope] += more
        kind, label = scope
        thread_loop().run(
            self.budgets.set_budget(f"{kind}:{label}", {"usd_per_day": self.limits[scope]})
        )

    @rule(key=st.sampled_from(sorted(KEYS)))
    def revoke(self, key: str) -> None:
        if key in self.revoked:
            return
        tenant, _, name = KEYS[key]
        assert thread_loop().run(self.budgets.revoke(f"{tenant}/{name}"))
        self.revoked.add(key)

    @precondition(lambda self: self.restart is not None and self.restarts < 2)
    @rule()
    def restart_the_store(self) -> None:
        """The store's process restarts: nothing counted is lost (a durable store)."""
        assert self.restart is not None
        self.restart()
        self.restarts += 1
        thread_loop().run(self.budgets.refresh(force=True))

    @invariant()
    def every_scope_holds_what_the_model_says_and_never_passes_its_limit(self) -> None:
        now = self.budgets.wall_clock()
        for (kind, label), value in self.values.items():
            assert value <= self.limits[(kind, label)] + EPSILON
            key = next(k for k in KEYS if (kind, label) in scopes_of(k))
            entry = self.budgets.tenants.keys[key]
            scope = next(s for s in self.budgets.scopes(entry, "c1") if s.kind == kind)
            windows = self.budgets.windows_of(scope, now)
            held = thread_loop().run(self.store.balance(windows[0][1]))
            assert abs(held - value) < 1e-7, ((kind, label), held, value)

    def teardown(self) -> None:
        closing = getattr(self.store, "aclose", None)
        if closing is not None:
            thread_loop().run(closing())
