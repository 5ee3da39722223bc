"""``guardstack spend``: who spent what, read from a gateway's ledger directly.

    guardstack spend --store sqlite:/var/lib/guardstack/ledger.sqlite3 \\
        --scope tenant:acme --window month --by team --format table

The same report as ``GET /admin/spend`` (its JSON with ``--format json``), from the
store the gateways count in — with no gateway running. ``--format csv`` gives one row
per line for a spreadsheet.
"""

from __future__ import annotations

import csv
import io
import json
import time
from typing import Any

from guardstack.cli.stores import store_from
from guardstack.gateway.spend import spend_report

__all__ = ["render", "spend"]


async def spend(
    store: str | None, scope: str | None, window: str, by: str | None
) -> dict[str, Any]:
    """The spend report from the ledger of the store ``--store`` names."""
    ledger: Any = store_from(store)
    try:
        return await spend_report(ledger, scope, window, by, time.time())
    finally:
        closing = getattr(ledger, "aclose", None)
        if closing is not None:
            await closing()


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
