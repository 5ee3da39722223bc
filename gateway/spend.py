"""The spend report: who spent what in a day or a month, read from the ledger's report
windows (``GET /admin/spend`` and ``guardstack spend`` answer with it)."""

from __future__ import annotations

import datetime
from typing import Any, Final

from guardstack.gateway.budget_values import REPORTED, SPEND
from guardstack.pipeline.contract import key_parts, store_key
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.ledger import calendar_window as period
from guardstack.pipeline.validate import did_you_mean

__all__ = ["BREAKDOWNS", "check_report", "spend_report"]

BREAKDOWNS: Final = {"tenant": 3, "team": 4, "key": 5, "model": 6, "conversation": 7}
#: The kinds of scope a report may be narrowed to.
SCOPES: Final = ("tenant", "team", "key", "model")


def check_report(scope: str | None, window: str, by: str | None) -> tuple[str, str, str]:
    """A report's arguments checked (``ConfigError`` naming what is wrong): the scope's
    kind, ``:`` and label."""
    if window not in REPORTED:
        raise ConfigError(f"window {window!r}: day or month", key="window", value=window)
    if by is not None and by not in BREAKDOWNS:
        raise ConfigError(f"by {by!r}: one of {', '.join(BREAKDOWNS)}", key="by", value=by)
    kind, colon, label = (scope or "").partition(":")
    if scope is not None and (kind not in SCOPES or not label):
        raise ConfigError(
            f"scope {scope!r}: {', '.join(f'{k}:NAME' for k in SCOPES)}"
            f"{did_you_mean(kind, SCOPES)}",
            key="scope",
            value=scope,
        )
    return kind, colon, label


async def spend_report(
    ledger: Any,
    scope: str | None,
    window: str,
    by: str | None,
    now: float,
    limit_usd: float | None = None,
    reserved_usd: float = 0.0,
) -> dict[str, Any]:
    """The spend report (``/admin/spend``, ``guardstack spend``), read from the ledger's
    report windows: the scope's total in the window and its rows ``by`` a breakdown."""
    kind, _, label = check_report(scope, window, by)
    name, start, end = period(now, window)
    prefix = store_key(SPEND, window, name) + ":"
    found = await ledger.windows(prefix)
    rows: dict[str, dict[str, float]] = {}
    total = 0.0
    for key, value in found.items():
        parts = key_parts(key)
        if len(parts) != 9:
            continue
        tenant, team, key_name, model, _, unit = parts[3:]
        if kind == "tenant" and tenant != label:
            continue
        if kind == "team" and f"{tenant}/{team}" != label:
            continue
        if kind == "key" and key_name != label:
            continue
        if kind == "model" and model != label:
            continue
        row_name = parts[BREAKDOWNS[by]] if by is not None else (label or "all")
        if by == "team":
            row_name = f"{tenant}/{team}"
        row = rows.setdefault(row_name, {"spent_usd": 0.0, "tokens": 0.0, "requests": 0.0})
        field = {"usd": "spent_usd", "tokens": "tokens", "requests": "requests"}[unit]
        row[field] += value
        if unit == "usd":
            total += value
    return {
        "scope": scope or "all",
        "window": window,
        "start": datetime.datetime.fromtimestamp(start, tz=datetime.UTC).isoformat(),
        "end": datetime.datetime.fromtimestamp(end, tz=datetime.UTC).isoformat(),
        "limit_usd": limit_usd,
        "spent_usd": round(total, 10),
        "reserved_usd": round(reserved_usd, 10),
        "rows": [
            {
                "name": row_name,
                "spent_usd": round(row["spent_usd"], 10),
                "tokens": int(row["tokens"]),
                "requests": int(row["requests"]),
            }
            for row_name, row in sorted(rows.items(), key=lambda item: -item[1]["spent_usd"])
        ],
    }
