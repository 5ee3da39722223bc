"""What operators do to budgets while the gateway runs (``/admin/keys``,
``/admin/budgets``, ``/admin/spend``): keys issued and revoked, budgets set, read and
removed, spend reported. ``Budgets`` has these as its own (a base class); each checks
what it is given before anything is stored, and a scope naming nothing is
``UnknownScope`` with a "did you mean"."""

from __future__ import annotations

import datetime
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from guardstack.gateway.budget_values import BudgetScope, Held
from guardstack.gateway.tenants import (
    NO_BUDGET,
    Budget,
    KeyEntry,
    Tenants,
    is_name,
    key_digest,
    read_budget,
)
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.validate import did_you_mean

__all__ = ["BudgetOperators", "UnknownScope"]


class UnknownScope(LookupError):
    """A scope an operator named that names no tenant, team or key (``404``)."""


class BudgetOperators:
    """The operators' side of ``Budgets`` (see the module docstring)."""

    tenants: Tenants
    store: Any
    overrides: dict[str, Budget]
    issued: dict[str, KeyEntry]
    revoked: set[str]
    in_flight: dict[str, Held]

    wall_clock: Callable[[], float]

    async def refresh(self, *, force: bool = False) -> None:
        raise NotImplementedError

    def budget_of(self, kind: str, label: str, configured: Budget) -> Budget:
        raise NotImplementedError

    def windows_of(self, scope: BudgetScope, now: float, *, wrap_up: bool = False) -> list[Any]:
        raise NotImplementedError

    async def issue(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """A new key (``POST /admin/keys``): ``{tenant, team?, name?, expires?, budget?,
        models?}``, each checked before anything is stored."""
        fields = ("tenant", "team", "name", "expires", "budget", "models")
        for field in request:
            if field not in fields:
                raise ConfigError(
                    f"{field!r} is not a key's field{did_you_mean(str(field), fields)}",
                    key=str(field),
                )
        for field in ("tenant", "team", "name", "expires"):
            value = request.get(field)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{field!r} must be text", key=field, value=value)
        tenant = request.get("tenant")
        if tenant not in self.tenants.tenants:
            known = list(self.tenants.tenants)
            raise ConfigError(
                f"no tenant {tenant!r}{did_you_mean(str(tenant), known)}",
                key="tenant",
                value=tenant,
            )
        team = request.get("team")
        if team is not None and team not in self.tenants.tenants[str(tenant)].teams:
            raise ConfigError(f"tenant {tenant!r} has no team {team!r}", key="team", value=team)
        name = request.get("name")
        if name is not None and not is_name(name):
            raise ConfigError(
                "a key's name is text of 1-128 characters, no '/' or control characters",
                key="name",
                value=name,
            )
        key_id = f"{tenant}/{name}" if name is not None else "k_" + secrets.token_hex(6)
        if name is not None and any(
            entry.id == key_id and entry.id not in self.revoked
            for entry in (*self.tenants.keys.values(), *self.issued.values())
        ):
            raise ConfigError(
                f"tenant {tenant!r} has a key named {name!r} already", key="name", value=name
            )
        budget = read_budget("budget", request.get("budget")) if request.get("budget") else None
        expires = request.get("expires")
        until = None
        if expires is not None:
            try:
                day = datetime.date.fromisoformat(str(expires))
            except ValueError:
                raise ConfigError("expires is a date, YYYY-MM-DD", key="expires") from None
            until = datetime.datetime.combine(
                day + datetime.timedelta(days=1), datetime.time(), datetime.UTC
            ).timestamp()
        key = "gsk-" + secrets.token_urlsafe(24)
        record = {
            "id": key_id,
            "tenant": tenant,
            "team": team,
            "name": name,
            "expires": until,
            "budget": budget.to_json() if budget else None,
        }
        await self.store.write_control(f"key:{key_digest(key)}", json.dumps(record))
        await self.refresh(force=True)
        return {"id": key_id, "key": key}

    async def revoke(self, key_id: str) -> bool:
        stored = await self.store.read_controls()
        for name, text in stored.items():
            if name.startswith("key:") and json.loads(text).get("id") == key_id:
                await self.store.write_control(name, None)
                await self.refresh(force=True)
                return True
        if any(entry.id == key_id for entry in self.tenants.keys.values()):
            await self.store.write_control(f"key:{key_id}", json.dumps({"revoked": True}))
            await self.refresh(force=True)
            return True
        return False

    def listed(self, tenant: str | None) -> list[dict[str, Any]]:
        keys = [*self.tenants.keys.values(), *self.issued.values()]
        return [
            {
                "id": entry.id,
                "tenant": entry.tenant,
                "team": entry.team,
                "name": entry.name,
                "expires": entry.expires,
                "revoked": entry.id in self.revoked,
            }
            for entry in keys
            if tenant is None or entry.tenant == tenant
        ]

    async def set_budget(self, scope: str, value: object) -> dict[str, Any]:
        """An operator's budget for ``scope`` (``PUT /admin/budgets/{scope}``): it names a
        tenant, team or key of the file or an issued key (else ``UnknownScope``), and the
        body is a budget (else ``ConfigError``)."""
        self.scope_named(scope)
        budget = read_budget(scope, value)
        await self.store.write_control(f"budget:{scope}", json.dumps(budget.to_json()))
        await self.refresh(force=True)
        return {"scope": scope, "budget": budget.to_json()}

    async def remove_budget(self, scope: str) -> dict[str, Any]:
        """The operator's budget for ``scope`` taken away: the file's applies again."""
        self.scope_named(scope)
        if scope not in self.overrides:
            raise UnknownScope(f"{scope!r} has no operator's budget to remove")
        await self.store.write_control(f"budget:{scope}", None)
        await self.refresh(force=True)
        return {"scope": scope, "removed": True}

    def overrides_listed(self) -> dict[str, Any]:
        """``GET /admin/budgets``: every operator's budget in force."""
        return {
            "overrides": [
                {"scope": scope, "budget": budget.to_json()}
                for scope, budget in sorted(self.overrides.items())
            ]
        }

    async def budget_view(self, scope: str) -> dict[str, Any]:
        """``GET /admin/budgets/{scope}``: the budget in force, where it comes from, and
        each window's limit, what is spent, reserved (in flight here) and left."""
        kind, label, configured = self.scope_named(scope)
        source = "override" if scope in self.overrides else "file"
        budget = self.overrides.get(scope, configured)
        now = self.wall_clock()
        parts = _parts_of(kind, label, self)
        windows = []
        for name, window, _ in self.windows_of(BudgetScope(kind, parts, label, budget), now):
            measure = name.partition("_per_")[0]
            held = await self.store.balance(window)
            reserved = sum(
                found.estimate.get(measure, 0.0)
                for found in self.in_flight.values()
                if any(s.kind == kind and s.parts == parts for s in found.scopes)
            )
            limit = budget.limits[name]
            windows.append(
                {
                    "window": name,
                    "limit": limit,
                    "unit": measure,
                    "spent": round(max(0.0, held - reserved), 10),
                    "reserved": round(reserved, 10),
                    "remaining": round(max(0.0, limit - held), 10),
                }
            )
        return {"scope": scope, "budget": budget.to_json(), "source": source, "windows": windows}

    def scope_named(self, scope: str) -> tuple[str, str, Budget]:
        """``(kind, label, the file's budget)`` of a scope an operator names, or
        ``UnknownScope`` with a "did you mean"."""
        kind, _, label = scope.partition(":")
        tenants = self.tenants.tenants
        known: list[str] = [f"tenant:{name}" for name in tenants]
        known += [f"team:{t}/{team}" for t, found in tenants.items() for team in found.teams]
        keys = {entry.id: entry for entry in (*self.tenants.keys.values(),
                                              *self.issued.values())}  # fmt: skip
        known += [f"key:{key_id}" for key_id in keys]
        known += ["defaults:key", "defaults:conversation"]
        if kind == "tenant" and label in tenants:
            return kind, label, tenants[label].budget
        if kind == "team":
            tenant, _, team = label.partition("/")
            if tenant in tenants and team in tenants[tenant].teams:
                return kind, label, tenants[tenant].teams[team].budget
        if kind == "key" and label in keys:
            own = keys[label].budget
            return kind, label, own if own is not None else self.tenants.key_default
        if scope == "defaults:key":
            return kind, label, self.tenants.key_default
        if scope == "defaults:conversation":
            return kind, label, self.tenants.conversation_default
        raise UnknownScope(
            f"no scope {scope!r}: tenant:NAME, team:TENANT/TEAM, key:TENANT/NAME or "
            f"defaults:key|conversation{did_you_mean(scope, known)}"
        )

    async def spend(self, scope: str | None, window: str, by: str | None) -> dict[str, Any]:
        """What a scope spent in this ``window`` (``day`` or ``month``), by a breakdown;
        a tenant, team or key that names nothing is ``UnknownScope``."""
        from guardstack.gateway.spend import spend_report

        if scope is not None and scope.partition(":")[0] in ("tenant", "team", "key"):
            self.scope_named(scope)
        return await spend_report(
            self.store,
            scope,
            window,
            by,
            self.wall_clock(),
            self.limit_of(scope, window),
            sum(held.estimate["usd"] for held in self.in_flight.values()),
        )

    def limit_of(self, scope: str | None, window: str) -> float | None:
        """The dollar limit of ``scope`` in ``window`` (``day`` or ``month``), if any."""
        if scope is None:
            return None
        kind, _, label = scope.partition(":")
        budget: Budget = NO_BUDGET
        if kind == "tenant" and label in self.tenants.tenants:
            budget = self.budget_of("tenant", label, self.tenants.tenants[label].budget)
        elif kind == "team":
            tenant, _, team = label.partition("/")
            found = self.tenants.tenants.get(tenant)
            configured = found.teams[team].budget if found and team in found.teams else NO_BUDGET
            budget = self.budget_of("team", label, configured)
        elif kind == "key":
            budget = self.overrides.get(scope, self.tenants.key_default)
        return budget.limits.get(f"usd_per_{window}")


def _parts_of(kind: str, label: str, budgets: BudgetOperators) -> tuple[str, ...]:
    """The store-key parts a scope's windows are kept under (as ``scopes`` builds them)."""
    if kind == "team":
        return tuple(label.partition("/")[::2])
    if kind == "key":
        for entry in (*budgets.tenants.keys.values(), *budgets.issued.values()):
            if entry.id == label:
                return (entry.tenant, entry.id)
    if kind == "defaults":
        return ("defaults", label)
    return (label,)
