"""``guardstack spend``: who spent what, read from a gateway's ledger directly.

    guardstack spend --store sqlite:/var/lib/guardstack/ledger.sqlite3 \\
        --scope tenant:acme --window month --by team --format table

The same report as ``GET /admin/spend`` (its JSON with ``--format json``), from the
store the gateways count in — with no gateway running. ``--format csv`` gives one row
per line for a spreadsheet. ``--tenants FILE`` adds each row's limit and the share of
it used, as the admin route does, and checks the scope names something.

It never guesses: a store that does not exist or cannot be opened is one line and
exit 2 (no empty ledger is created where a path was mistyped); a scope naming nothing
is an error.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import time
from pathlib import Path
from typing import Any

from guardstack.cli.stores import store_from
from guardstack.gateway.spend import check_report, spend_report
from guardstack.pipeline.errors import ConfigError

__all__ = ["render", "spend"]


def _existing_ledger(spec: str | None) -> Any:
    """The store ``spec`` names, only if it exists: a report never creates a ledger."""
    from guardstack.integrations.sqlite import default_path

    if spec == "memory":
        raise ConfigError(
            "--store memory: a memory store lives and dies with its gateway; name the "
            "gateway's sqlite:PATH or redis:// store",
            key="store",
            value=spec,
        )
    if spec is None or spec == "sqlite" or spec.startswith("sqlite:"):
        path = (
            default_path()
            if spec in (None, "sqlite")
            else Path(str(spec).removeprefix("sqlite:").removeprefix("//")).expanduser()
        )
        if not path.is_file():
            raise ConfigError(
                f"no ledger at {path}: nothing was counted there (is the path the "
                "gateway's --store?)",
                key="store",
                value=spec,
            )
    return store_from(spec)


async def spend(
    store: str | None,
    scope: str | None,
    window: str,
    by: str | None,
    tenants: Path | None = None,
) -> dict[str, Any]:
    """The spend report from the ledger of the store ``--store`` names (see the module
    docstring)."""
    check_report(scope, window, by)
    budgets = None
    if tenants is not None:
        from guardstack.gateway.budgets import Budgets
        from guardstack.gateway.tenants import read_tenants

        budgets = Budgets(read_tenants(tenants), None)
        if scope is not None and scope.partition(":")[0] in ("tenant", "team", "key"):
            try:
                budgets.scope_named(scope)
            except LookupError as unknown:
                raise ConfigError(str(unknown).strip("'\""), key="scope", value=scope) from None
    ledger: Any = _existing_ledger(store)
    try:
        try:
            report = await spend_report(ledger, scope, window, by, time.time())
        except ConfigError:
            raise
        except Exception as error:  # not a ledger, unreadable, a server that is down
            raise ConfigError(
                f"the store {store or 'sqlite'} cannot be read: {type(error).__name__}: "
                f"{str(error)[:200]}",
                key="store",
                value=store,
            ) from None
    finally:
        closing = getattr(ledger, "aclose", None)
        if closing is not None:
            with contextlib.suppress(Exception):  # one that would not open will not close
                await closing()
    if scope is not None and not report["rows"] and budgets is None:
        found = await _named_anywhere(store, scope)
        if not found:
            raise ConfigError(
                f"scope {scope!r} names nothing this ledger counted (give --tenants FILE "
                "to check it against the tenants)",
                key="scope",
                value=scope,
            )
    if budgets is not None:
        _with_limits(report, budgets, scope, window, by)
    return report


async def _named_anywhere(store: str | None, scope: str) -> bool:
    """Whether this month's ledger holds any row of ``scope`` (a scope with no spend
    today may still be real)."""
    ledger: Any = _existing_ledger(store)
    try:
        month = await spend_report(ledger, scope, "month", None, time.time())
    finally:
        closing = getattr(ledger, "aclose", None)
        if closing is not None:
            await closing()
    return bool(month["rows"])


def _with_limits(
    report: dict[str, Any], budgets: Any, scope: str | None, window: str, by: str | None
) -> None:
    """Each row's limit in this window and the share of it used (``--tenants``)."""
    report["limit_usd"] = budgets.limit_of(scope, window)
    for row in report["rows"]:
        named = f"{by}:{row['name']}" if by in ("tenant", "team", "key") else None
        limit = budgets.limit_of(named, window) if named is not None else None
        row["limit_usd"] = limit
        row["share"] = round(row["spent_usd"] / limit, 6) if limit else None


def render(report: dict[str, Any], form: str) -> str:
    """The report as a table, JSON or CSV."""
    if form == "json":
        return json.dumps(report, indent=2)
    rows = report["rows"]
    if form == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["name", "spent_usd", "tokens", "requests"])
        for row in rows:
            writer.writerow(
                [row["name"], f"{row['spent_usd']:.6f}", row["tokens"], row["requests"]]
            )
        return out.getvalue().rstrip("\n")
    limit = report["limit_usd"]
    head = (
        f"{report['scope']}, this {report['window']} ({report['start'][:10]} to "
        f"{report['end'][:10]}): ${report['spent_usd']:.4f} spent"
        + (f" of ${limit:.2f}" if limit is not None else "")
    )
    width = max([len("name"), *(len(str(row["name"])) for row in rows)])
    lines = [head, f"{'name':<{width}}  {'spent_usd':>12}  {'tokens':>10}  {'requests':>8}"]
    for row in rows:
        lines.append(
            f"{row['name']:<{width}}  {row['spent_usd']:>12.4f}  {row['tokens']:>10}  "
            f"{row['requests']:>8}"
        )
    return "\n".join(lines)
