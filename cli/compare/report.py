"""What ``compare`` prints and draws: a Markdown table, and a figure of the latency
distributions and success rates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from guardstack.cli.compare.engine import StackStats
from guardstack.cli.compare.scenario import Scenario
from guardstack.integrations._extras import require


def render(results: Sequence[StackStats]) -> str:
    """A side-by-side table (Markdown, so it pastes into docs)."""
    headers = ["stack", "success", "p50 ms", "p95 ms", "p99 ms", "runs/call", "wasted tool-s",
               "timeouts by code"]  # fmt: skip
    rows = [
        [
            stats.config,
            f"{stats.success_rate:.1%}",
            f"{stats.p50_ms:,.0f}",
            f"{stats.p95_ms:,.0f}",
            f"{stats.p99_ms:,.0f}",
            f"{stats.mean_attempts:.2f}",
            f"{stats.wasted_tool_s:,.1f}",
            ", ".join(f"{code} {n}" for code, n in stats.timeouts_by_code.items()) or "—",
        ]
        for stats in results
    ]
    if any(stats.first_byte_p50_ms is not None for stats in results):
        headers.insert(5, "first byte p50 ms")
        for row, stats in zip(rows, results, strict=True):
            first = stats.first_byte_p50_ms
            row.insert(5, "—" if first is None else f"{first:,.0f}")
    table = _markdown(headers, rows)
    tenants = [name for stats in results for name in stats.tenants]
    if not tenants:
        return table
    names = list(dict.fromkeys(tenants))
    per_tenant = [
        [stats.config] + [_tenant_cell(stats.tenants.get(name)) for name in names]
        for stats in results
    ]
    header = ["stack", *(f"{name}: p50 / p99 ms, success" for name in names)]
    return table + "\n\n" + _markdown(header, per_tenant)


def _tenant_cell(seen: Mapping[str, float] | None) -> str:
    if seen is None:
        return "—"
    return f"{seen['p50_ms']:,.0f} / {seen['p99_ms']:,.0f}, {seen['success_rate']:.1%}"


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    return "\n".join(lines)


def figure(
    results: Sequence[StackStats],
    *,
    title: str | None = None,
    budgets_ms: Mapping[str, float] | None = None,
) -> Any:
    """The comparison as a matplotlib figure: each stack's latency distribution (left) and
    success rate (right), one colour per stack in both, the rate printed on its bar, and a
    dashed marker at each tool's declared budget."""
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")  # no display needed
    pyplot = require("matplotlib.pyplot", "plot")
    drawn, (latency, success) = pyplot.subplots(
        1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]}
    )
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for index, stats in enumerate(results):
        colour = colours[index % len(colours)]
        if stats.tenant_latencies_ms:  # one line per tenant, in the stack's colour
            for number, (tenant, series) in enumerate(sorted(stats.tenant_latencies_ms.items())):
                shares = [(n + 1) / len(series) for n in range(len(series))]
                latency.step(series, shares, where="post", color=colour,
                             linestyle=styles[number % len(styles)],
                             label=f"{stats.config} — {tenant}")  # fmt: skip
            continue
        count = len(stats.latencies_ms)
        shares = [(n + 1) / count for n in range(count)]
        latency.step(stats.latencies_ms, shares, where="post", label=stats.config, color=colour)
    for tool, ms in sorted((budgets_ms or {}).items()):
        latency.axvline(ms, color="grey", linestyle="--", linewidth=1)
        latency.annotate(
            f"{tool} budget {ms:,.0f} ms",
            (ms, 0.02),
            rotation=90,
            fontsize="x-small",
            color="grey",
            ha="right",
            va="bottom",
        )
    latency.set_xscale("log")
    latency.set_xlabel("latency per call (ms, log scale)")
    latency.set_ylabel("share of calls answered or given up by then")
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize="small")
    names = [stats.config for stats in results]
    rates = [stats.success_rate * 100 for stats in results]
    bars = success.barh(
        names, rates, color=[colours[index % len(colours)] for index in range(len(results))]
    )
    for bar, rate in zip(bars, rates, strict=True):
        inside = rate > 25
        success.text(
            rate - 2 if inside else rate + 2,
            bar.get_y() + bar.get_height() / 2,
            f"{rate:.1f}%",
            va="center",
            ha="right" if inside else "left",
            color="white" if inside else "black",
            fontsize="small",
        )
    success.set_xlim(0, 100)
    success.set_xlabel("success (%)")
    success.invert_yaxis()
    if title:
        drawn.suptitle(title)
    drawn.tight_layout()
    return drawn


def plot(
    results: Sequence[StackStats],
    path: str,
    *,
    title: str | None = None,
    budgets_ms: Mapping[str, float] | None = None,
) -> None:
    """``figure(...)`` saved as a PNG."""
    drawn = figure(results, title=title, budgets_ms=budgets_ms)
    pyplot = require("matplotlib.pyplot", "plot")
    drawn.savefig(path, dpi=110)
    pyplot.close(drawn)


def scenario_budgets(scenario: Scenario) -> dict[str, float]:
    """Each simulated tool's declared budget (for the plot's markers)."""
    return {tool.name: float(tool.timeout_ms) for tool in scenario.tools if tool.timeout_ms}
