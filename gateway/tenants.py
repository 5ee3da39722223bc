"""The tenants file both gateways read (``--tenants FILE``): who may spend, and how much.

::

    keys:
      sk-acme-alice-0123456789: {tenant: acme, team: research, name: alice}
      sk-acme-ci-0123456789abc: {tenant: acme, team: ci, name: ci, expires: 2027-01-31}
      sk-globex-0123456789abcd: globex          # short form: a tenant
    tenants:
      acme:
        budget: {usd_per_month: 1000, usd_per_day: 80}
        models: [gpt-4o, gpt-4o-mini]           # optional allow-list; another model: 403
        teams:
          research: {budget: {usd_per_day: 50}}
          ci: {budget: {usd_per_day: 20, tokens_per_minute: 200000}}
        servers: {}                             # the MCP gateway's, as before
        quotas: []
      globex:
        budget: {usd_per_day: 5}
    defaults:
      key: {budget: {usd_per_day: 10}}          # every key's own, unless the key sets one
      conversation: {budget: {usd: 2}}          # every conversation's
    prices: {gpt-4o: [2.5, 10], gpt-4o-mini: [0.15, 0.6]}

**Scopes**: tenant → team → key → conversation. A **budget** maps windows to amounts:
``usd`` and ``tokens`` (whole life) and ``usd_per_W``, ``tokens_per_W``,
``requests_per_W`` for W in ``minute``, ``hour``, ``day``, ``week``, ``month``
(calendar windows in UTC); ``on_limit`` (``stop`` or ``wrap_up``), ``wrap_up_tokens``
(1,000) and ``alert_at`` (a fraction) say what happens at its end. Every earlier shape
is read too: the model proxy's ``{key: tenant}`` and the MCP gateway's ``{keys,
tenants: {servers, quotas}}``. A bad file is one ``ConfigError`` naming the file, the
path in it and the value, with a "did you mean".
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from guardstack.guards.usage_costs import Price, read_prices
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import read_config_file
from guardstack.pipeline.validate import cut, did_you_mean

__all__ = [
    "BUDGET_WINDOWS",
    "Budget",
    "KeyEntry",
    "Team",
    "Tenant",
    "Tenants",
    "is_name",
    "key_digest",
    "key_id",
    "read_budget",
    "read_tenants",
    "tenants_of",
]

#: Calendar windows, shortest first (UTC).
PERIODS: Final = ("minute", "hour", "day", "week", "month")
MEASURES: Final = ("usd", "tokens", "requests")
#: Every window a budget may name.
BUDGET_WINDOWS: Final = frozenset(
    {"usd", "tokens"} | {f"{m}_per_{p}" for m in MEASURES for p in PERIODS}
)
_BUDGET_KEYS: Final = BUDGET_WINDOWS | {"on_limit", "wrap_up_tokens", "alert_at"}
#: The largest amount a budget window takes (past it, a typo or an overflow).
MOST_AMOUNT: Final = 1e15
_SCOPE_NAME: Final = re.compile(r"[^\x00-\x1f\x7f/]{1,128}")


@attrs.frozen
class Budget:
    """Windows and their amounts (``{"usd_per_day": 50.0}``), and what happens at the end:
    ``stop`` or ``wrap_up`` (one last answer without tools, inside ``wrap_up_tokens``)."""

    limits: Mapping[str, float] = attrs.field(factory=dict)
    on_limit: str = "stop"
    wrap_up_tokens: int = 1_000
    alert_at: float | None = None

    def __bool__(self) -> bool:
        return bool(self.limits)

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = dict(self.limits)
        if self.on_limit != "stop":
            found["on_limit"] = self.on_limit
        if self.wrap_up_tokens != 1_000:
            found["wrap_up_tokens"] = self.wrap_up_tokens
        if self.alert_at is not None:
            found["alert_at"] = self.alert_at
        return found


NO_BUDGET: Final = Budget()


@attrs.frozen
class Team:
    """A team: its budget and the models it may ask for (``None``: what its tenant may)."""

    name: str
    budget: Budget = NO_BUDGET
    models: frozenset[str] | None = None


@attrs.frozen
class Tenant:
    """A tenant: its budget, its teams, the models it may ask for (``None``: any), and
    the MCP gateway's servers and quotas (kept as the file has them)."""

    name: str
    budget: Budget = NO_BUDGET
    teams: Mapping[str, Team] = attrs.field(factory=dict)
    models: frozenset[str] | None = None
    servers: Any = None
    quotas: Any = None


@attrs.frozen
class KeyEntry:
    """A client key's place: tenant, team, name, when it expires (the end of that UTC
    day, epoch seconds), its own budget. ``id`` names it in admin routes, scopes,
    reports and the decision log — ``TENANT/NAME`` when it has a name (names are unique
    within a tenant, so two tenants' ``alice`` never meet), its digest id otherwise;
    never the key itself."""

    id: str
    tenant: str
    team: str | None = None
    name: str | None = None
    expires: float | None = None
    budget: Budget | None = None
    #: The models the key may ask for beyond its tenant's and team's lists (globs).
    models: frozenset[str] | None = None

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires

    @property
    def shown(self) -> str:
        """How reports name it: its id (``TENANT/NAME``, else its digest id)."""
        return self.id


@attrs.frozen
class Tenants:
    """Everything a tenants file says."""

    keys: Mapping[str, KeyEntry]
    tenants: Mapping[str, Tenant]
    key_default: Budget = NO_BUDGET
    conversation_default: Budget = NO_BUDGET
    prices: Mapping[str, Price] | None = None
    source: str = "<tenants>"

    def describe(self) -> str:
        """The tree: tenants, their teams and keys (by name), each with its budget."""
        lines = []
        for tenant in self.tenants.values():
            models = f"; models {', '.join(sorted(tenant.models))}" if tenant.models else ""
            lines.append(f"{tenant.name}: {_shown(tenant.budget)}{models}")
            for team in tenant.teams.values():
                lines.append(f"  team {team.name}: {_shown(team.budget)}")
            for entry in self.keys.values():
                if entry.tenant != tenant.name:
                    continue
                where = f" (team {entry.team})" if entry.team else ""
                until = f", expires {_day(entry.expires)}" if entry.expires is not None else ""
                own = entry.budget if entry.budget is not None else self.key_default
                lines.append(f"  key {entry.shown}{where}: {_shown(own)}{until}")
        if self.conversation_default:
            lines.append(f"every conversation: {_shown(self.conversation_default)}")
        return "\n".join(lines)


def _shown(budget: Budget) -> str:
    if not budget:
        return "no budget"
    parts = [f"{name} {amount:g}" for name, amount in budget.limits.items()]
    if budget.on_limit == "wrap_up":
        parts.append(f"wrap up in {budget.wrap_up_tokens} tokens")
    return ", ".join(parts)


def _day(epoch: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch - 1, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d")


def key_digest(key: str) -> str:
    """How a client key is stored and found: its SHA-256, never the key itself."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_id(key: str) -> str:
    """A key's id when the file gives it no name: a short digest, never the key."""
    return "k_" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]


class _Fail:
    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, path: str, value: object, what: str) -> ConfigError:
        # a path holds names as the file wrote them: control characters escaped, so the
        # error stays one line (and --watch's line with it)
        shown = path.encode("unicode_escape").decode("ascii") if not path.isprintable() else path
        return ConfigError(
            f"{self.source}: {shown}: {what}, got {cut(value)}", key=path, value=value
        )


def read_budget(where: str, value: object, fail: _Fail | None = None) -> Budget:
    """A budget mapping (``{"usd_per_day": 40, "on_limit": "wrap_up"}``), checked."""
    fail = fail or _Fail("budget")
    if value is None:
        return NO_BUDGET
    if not isinstance(value, Mapping):
        raise fail(where, value, "a budget: a mapping of windows (usd_per_day…) to amounts")
    limits: dict[str, float] = {}
    for name, amount in value.items():
        if name not in _BUDGET_KEYS:
            near = did_you_mean(str(name), sorted(_BUDGET_KEYS))
            raise fail(f"{where}.{name}", name, f"not a budget window{near}")
        if name in ("on_limit", "wrap_up_tokens", "alert_at"):
            continue
        if (
            isinstance(amount, bool)
            or not isinstance(amount, int | float)
            or not 0 <= amount < MOST_AMOUNT
        ):
            raise fail(f"{where}.{name}", amount, "a finite number >= 0")
        limits[str(name)] = float(amount)
    on_limit = value.get("on_limit", "stop")
    if on_limit not in ("stop", "wrap_up"):
        raise fail(f"{where}.on_limit", on_limit, "'stop' or 'wrap_up'")
    tokens = value.get("wrap_up_tokens", 1_000)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise fail(f"{where}.wrap_up_tokens", tokens, "a whole number above 0")
    alert = value.get("alert_at")
    if alert is not None and (
        isinstance(alert, bool) or not isinstance(alert, int | float) or not 0 < alert < 1
    ):
        raise fail(f"{where}.alert_at", alert, "a fraction between 0 and 1")
    return Budget(limits, str(on_limit), tokens, float(alert) if alert is not None else None)


def _budget_of(fail: _Fail, where: str, entry: Mapping[str, Any], allowed: set[str]) -> Budget:
    for name in entry:
        if name not in allowed:
            near = did_you_mean(str(name), sorted(allowed))
            raise fail(f"{where}.{name}", name, f"not a key here{near}")
    return read_budget(f"{where}.budget", entry.get("budget"), fail)


def is_name(value: object) -> bool:
    """A tenant's, team's or key's name: text of 1-128 characters, no ``/`` and no
    control characters (a name is part of a key id, a scope and a report's row)."""
    return isinstance(value, str) and _SCOPE_NAME.fullmatch(value) is not None


def _name(fail: _Fail, where: str, value: object) -> str:
    if not is_name(value):
        raise fail(where, value, "a name: text, no '/' or control characters, 1-128 long")
    return str(value)


def _expires(fail: _Fail, where: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        day = value
    else:
        try:
            day = datetime.date.fromisoformat(str(value))
        except ValueError:
            raise fail(
                where, value, "a date, YYYY-MM-DD (the key works through that day)"
            ) from None
    end = datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time(), datetime.UTC)
    return end.timestamp()


def read_tenants(path: str | Path) -> Tenants:
    """The tenants file in ``path`` (any earlier shape too)."""
    source = str(path)
    return tenants_of(read_config_file(source, "tenants file"), source)


def tenants_of(data: object, source: str = "<tenants>") -> Tenants:
    fail = _Fail(source)
    if not isinstance(data, Mapping) or not data:
        # never the data itself: a list of client keys is a likely mistake here
        what = type(data).__name__ if data else "nothing"
        raise fail("tenants", f"<{what}>", "a mapping: {keys, tenants, defaults, prices}")
    top = {"keys", "tenants", "defaults", "prices"}
    flat = all(isinstance(value, str) for value in data.values())
    if not set(data) & top and flat:  # the model proxy's earlier shape: {key: tenant}
        return _flat(fail, data, source)
    for name in data:
        if name not in top:
            # a client key written at the top level ({KEY: 5}) is named by its id only
            shown = str(name) if len(str(name)) < 16 else key_id(str(name))
            raise fail(
                shown,
                shown,
                f"not a key of a tenants file{did_you_mean(str(name), sorted(top))}",
            )
    tenants_data = data.get("tenants") or {}
    if not isinstance(tenants_data, Mapping):
        raise fail("tenants", tenants_data, "a mapping of tenant names to their entries")
    tenants = {
        _name(fail, f"tenants.{name}", name): _tenant(fail, str(name), entry)
        for name, entry in tenants_data.items()
    }
    keys = _keys(fail, data.get("keys"), tenants)
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise fail("defaults", defaults, "{key: {budget}, conversation: {budget}}")
    for name in defaults:
        if name not in ("key", "conversation"):
            raise fail(
                f"defaults.{name}",
                name,
                f"not a default{did_you_mean(str(name), ['key', 'conversation'])}",
            )
    key_default = _default(fail, "defaults.key", defaults.get("key"))
    conversation_default = _default(fail, "defaults.conversation", defaults.get("conversation"))
    prices = None
    if data.get("prices") is not None:
        try:
            prices = read_prices(data["prices"])
        except ConfigError as error:
            raise fail(
                f"prices{_after(error.key, 'prices')}",
                error.value,
                "[usd per million input, output]",
            ) from None
    return Tenants(keys, tenants, key_default, conversation_default, prices, source)


def _after(key: object, prefix: str) -> str:
    text = str(key or "")
    return text[len(prefix) :] if text.startswith(prefix) else ""


def _default(fail: _Fail, where: str, entry: object) -> Budget:
    if entry is None:
        return NO_BUDGET
    if not isinstance(entry, Mapping):
        raise fail(where, entry, "{budget: {...}}")
    return _budget_of(fail, where, entry, {"budget"})


def _tenant(fail: _Fail, name: str, entry: object) -> Tenant:
    where = f"tenants.{name}"
    if entry is None:
        return Tenant(name)
    if not isinstance(entry, Mapping):
        raise fail(where, entry, "{budget, teams, models, servers, quotas}")
    budget = _budget_of(fail, where, entry, {"budget", "teams", "models", "servers", "quotas"})
    teams_data = entry.get("teams") or {}
    if not isinstance(teams_data, Mapping):
        raise fail(f"{where}.teams", teams_data, "a mapping of team names to {budget}")
    teams = {}
    for team_name, team in teams_data.items():
        at = f"{where}.teams.{team_name}"
        _name(fail, at, team_name)
        if team is not None and not isinstance(team, Mapping):
            raise fail(at, team, "{budget: {...}}")
        team = team or {}
        budget_of_team = _budget_of(fail, at, team, {"budget", "models"})
        teams[str(team_name)] = Team(
            str(team_name), budget_of_team, _models(fail, f"{at}.models", team.get("models"))
        )
    return Tenant(
        name,
        budget,
        teams,
        _models(fail, f"{where}.models", entry.get("models")),
        entry.get("servers"),
        entry.get("quotas"),
    )


def _models(fail: _Fail, where: str, models: object) -> frozenset[str] | None:
    """An allow-list: model names or globs (``claude-haiku-*``); ``None`` when absent."""
    if models is None:
        return None
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise fail(where, models, "a list of model names or globs (gpt-4o-mini, claude-*)")
    return frozenset(models)


def _keys(fail: _Fail, data: object, tenants: dict[str, Tenant]) -> dict[str, KeyEntry]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise fail("keys", "…", "a mapping of client keys to a tenant or {tenant, team, name}")
    found: dict[str, KeyEntry] = {}
    names: set[tuple[str, str]] = set()
    for key, entry in data.items():
        if not isinstance(key, str) or len(key) < 16:
            raise fail("keys", "…", "each client key is text of 16 characters or more")
        where = f"keys.{key_id(key)}"  # never the key itself in an error
        if isinstance(entry, str):
            entry = {"tenant": entry}
        if not isinstance(entry, Mapping):
            raise fail(where, entry, "a tenant name, or {tenant, team, name, expires, budget}")
        allowed = {"tenant", "team", "name", "expires", "budget", "models"}
        budget = _budget_of(fail, where, entry, allowed) if "budget" in entry else None
        if budget is None:
            _budget_of(fail, where, entry, allowed)
        tenant = entry.get("tenant")
        if tenant not in tenants:
            raise fail(
                f"{where}.tenant",
                tenant,
                f"not a tenant of the file{did_you_mean(str(tenant), list(tenants))}",
            )
        team = entry.get("team")
        if team is not None and team not in tenants[str(tenant)].teams:
            known = list(tenants[str(tenant)].teams)
            raise fail(
                f"{where}.team", team, f"not a team of {tenant!r}{did_you_mean(str(team), known)}"
            )
        name = entry.get("name")
        if name is not None:
            name = _name(fail, f"{where}.name", name)
            if (str(tenant), name) in names:
                raise fail(f"{where}.name", name, f"a name another key of {tenant!r} has")
            names.add((str(tenant), name))
        found[key] = KeyEntry(
            f"{tenant}/{name}" if name is not None else key_id(key),
            str(tenant),
            str(team) if team is not None else None,
            name,
            _expires(fail, f"{where}.expires", entry.get("expires")),
            budget,
            _models(fail, f"{where}.models", entry.get("models")),
        )
    return found


def _flat(fail: _Fail, data: Mapping[str, Any], source: str) -> Tenants:
    """The model proxy's earlier ``--keys`` file: ``{key: tenant}``."""
    keys: dict[str, KeyEntry] = {}
    for key, tenant in data.items():
        if not (isinstance(key, str) and key and isinstance(tenant, str) and tenant):
            raise fail("keys", "…", "each client key mapped to a tenant name (text)")
        keys[key] = KeyEntry(key_id(key), tenant)
    tenants = {entry.tenant: Tenant(entry.tenant) for entry in keys.values()}
    return Tenants(keys, tenants, source=source)
