"""``guardstack compare``: your stacks, side by side, on the same seeded faults, in virtual time.

A scenario file (YAML, TOML or JSON) describes the tools — each one's declared
budget, latency, hang and failure probabilities, failure code and idempotency —
and the call mix. Every stack runs the same calls: the *k*-th attempt of call *n*
behaves the same under every stack, drawn from ``--seed``. Time is trio's
``MockClock``, so 10,000 calls with seconds of simulated latency take seconds,
and the same seed gives the same numbers. Per stack: success rate, latency
percentiles, tool runs per call, tool-seconds spent on runs whose result was not
used, and the timeouts by code (whose timer fired).

Scenario keys: ``calls``; ``give_up_s`` (when the caller stops waiting, default
60); ``tools``: name → ``timeout_ms``, ``latency_ms`` (a number, or ``{median,
p99}`` for a lognormal), ``hang_probability``, ``failure_probability``,
``failure_code`` (default ``TOOL_FAILED``), ``idempotent``; ``mix``: tool →
weight (default equal).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import attrs

from guardstack.integrations._extras import require
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness, read_config_file
from guardstack.pipeline.validate import cut
from guardstack.pipeline.values import TOOL_FAILED, ToolCall, ToolDefinition, ToolResult

__all__ = ["Scenario", "StackStats", "ToolProfile", "compare", "load_scenario", "plot", "render"]

EXTRA = "compare"
MAX_ATTEMPTS = 16  # draws per call: more than any sensible retry makes
_Z99 = 2.3263478740408408  # the standard normal's 99th percentile


@attrs.frozen
class ToolProfile:
    """How one simulated tool behaves on each attempt, independently."""

    name: str
    timeout_ms: int | None = None
    latency_median_ms: float = 100.0
    latency_p99_ms: float = 100.0
    hang_probability: float = 0.0
    failure_probability: float = 0.0
    failure_code: str = TOOL_FAILED
    idempotent: bool | None = None

    def draw(self, rng: random.Random) -> tuple[str, float]:
        """One attempt: ``("hang"|"fail"|"ok", seconds)``."""
        roll = rng.random()
        sigma = math.log(self.latency_p99_ms / self.latency_median_ms) / _Z99
        seconds = self.latency_median_ms * math.exp(sigma * rng.gauss(0, 1)) / 1000
        if roll < self.hang_probability:
            return "hang", math.inf
        if roll < self.hang_probability + self.failure_probability:
            return "fail", seconds
        return "ok", seconds


@attrs.frozen
class Scenario:
    tools: tuple[ToolProfile, ...]
    weights: tuple[float, ...]
    calls: int = 1_000
    give_up_s: float = 60.0


@attrs.frozen
class StackStats:
    config: str
    success_rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_attempts: float
    wasted_tool_s: float
    timeouts_by_code: Mapping[str, int]
    #: Every call's latency, sorted (for ``plot``; not part of ``to_dict``).
    latencies_ms: tuple[float, ...] = attrs.field(default=(), eq=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        del data["latencies_ms"]
        return data


def _number(where: str, key: str, value: object, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(
            f"scenario {where}: `{key}` must be a number from {low} to {high}, got {cut(value)}",
            key=key,
            value=value,
        )
    return float(value)


def load_scenario(source: str | Mapping[str, Any]) -> Scenario:
    """A scenario from a file path (YAML, TOML, JSON) or an already-read mapping."""
    data = read_config_file(source) if isinstance(source, str) else source
    if not isinstance(data, Mapping) or not isinstance(data.get("tools"), Mapping):
        raise ConfigError("scenario: expected a mapping with a `tools` mapping", key="tools")
    known = {"calls", "tools", "mix", "give_up_s"}
    for key in data:
        if key not in known:
            raise ConfigError(f"scenario: unknown key {key!r}", key=str(key), value=data[key])
    tools = []
    for name, spec in data["tools"].items():
        if not isinstance(spec, Mapping):
            raise ConfigError(f"scenario tool {name!r}: expected a mapping", key=str(name))
        latency = spec.get("latency_ms", 100)
        if isinstance(latency, Mapping):
            median = _number(name, "latency_ms.median", latency.get("median"), 0.001)
            p99 = _number(name, "latency_ms.p99", latency.get("p99"), median)
        else:
            median = p99 = _number(name, "latency_ms", latency, 0.001)
        timeout = spec.get("timeout_ms")
        tools.append(
            ToolProfile(
                str(name),
                int(_number(name, "timeout_ms", timeout, 1)) if timeout is not None else None,
                median,
                p99,
                _number(name, "hang_probability", spec.get("hang_probability", 0), 0, 1),
                _number(name, "failure_probability", spec.get("failure_probability", 0), 0, 1),
                str(spec.get("failure_code", TOOL_FAILED)),
                spec.get("idempotent"),
            )
        )
    mix = data.get("mix") or {}
    weights = tuple(
        _number("mix", tool.name, mix.get(tool.name, 0 if mix else 1), 0) for tool in tools
    )
    calls = int(_number("", "calls", data.get("calls", 1_000), 1))
    give_up = _number("", "give_up_s", data.get("give_up_s", 60), 0.001)
    return Scenario(tuple(tools), weights, calls, give_up)


@attrs.frozen
class _Plan:
    tools: tuple[str, ...]  # the tool of each call
    attempts: tuple[tuple[tuple[str, float], ...], ...]  # each call's attempt draws


def _plan(scenario: Scenario, seed: int, calls: int) -> _Plan:
    rng = random.Random(seed)
    by_name = {tool.name: tool for tool in scenario.tools}
    names = [tool.name for tool in scenario.tools]
    chosen = tuple(rng.choices(names, weights=scenario.weights, k=calls))
    draws = tuple(tuple(by_name[name].draw(rng) for _ in range(MAX_ATTEMPTS)) for name in chosen)
    return _Plan(chosen, draws)


async def _run_stack(
    label: str,
    build: Callable[[], Harness],
    scenario: Scenario,
    plan: _Plan,
    advance: Callable[[], None],
) -> StackStats:
    harness = build()
    runs: dict[int, list[tuple[float, float]]] = {}

    def simulated(profile: ToolProfile) -> Any:
        async def execute(arguments: Mapping[str, Any], call: ToolCall) -> object:
            index = int(call.call_id)
            kind, seconds = plan.attempts[index][min(call.attempt, MAX_ATTEMPTS) - 1]
            started = anyio.current_time()
            try:
                await anyio.sleep(seconds)
            finally:
                runs.setdefault(index, []).append((started, anyio.current_time()))
            if kind == "fail":
                return ToolResult.failure("simulated failure", code=profile.failure_code)
            return "ok"

        return execute

    for profile in scenario.tools:
        if harness.tools.get(profile.name) is None:
            harness.tools.register(
                ToolDefinition(
                    profile.name,
                    simulated(profile),
                    timeout_ms=profile.timeout_ms,
                    idempotent=profile.idempotent,
                )
            )
    latencies: list[float] = []
    successes = 0
    wasted = 0.0
    timeouts: dict[str, int] = {}
    for index, name in enumerate(plan.tools):
        started = anyio.current_time()
        result = None
        with anyio.move_on_after(scenario.give_up_s):
            call = ToolCall(name, {}, str(index), conversation=f"call-{index}")
            result = (await harness.tools.execute(call)).result
        latencies.append(anyio.current_time() - started)
        spent = [end - begin for begin, end in runs.get(index, [])]
        if result is not None and not result.is_error:
            successes += 1
            spent = spent[:-1]  # the last run's answer was used
        wasted += sum(spent)
        if (
            result is not None
            and result.error is not None
            and result.error.name == ("ToolTimeoutError")
        ):
            code = result.code or "?"
            timeouts[code] = timeouts.get(code, 0) + 1
        elif result is None:
            timeouts["caller gave up"] = timeouts.get("caller gave up", 0) + 1
        advance()
    latencies.sort()
    count = len(latencies)

    def percentile(fraction: float) -> float:
        return latencies[min(count - 1, int(fraction * count))] * 1000

    return StackStats(
        label,
        successes / count,
        percentile(0.50),
        percentile(0.95),
        percentile(0.99),
        sum(len(r) for r in runs.values()) / count,
        wasted,
        dict(sorted(timeouts.items())),
        tuple(latency * 1000 for latency in latencies),
    )


def compare(
    stacks: Sequence[tuple[str, Callable[[], Harness]]],
    scenario: Scenario,
    *,
    seed: int = 0,
    calls: int | None = None,
    progress: bool = False,
) -> list[StackStats]:
    """Run every stack on the same seeded calls, each in its own virtual-time trio run."""
    trio = require("trio", EXTRA)
    testing = require("trio.testing", EXTRA)
    total = calls or scenario.calls
    plan = _plan(scenario, seed, total)
    results = []
    bar: Any = None
    if progress:
        rich_progress = require("rich.progress", EXTRA)
        bar = rich_progress.Progress(transient=True)
        bar.start()
    try:
        for label, build in stacks:
            task = bar.add_task(label, total=total) if bar is not None else None

            def advance(task: Any = task) -> None:
                if bar is not None:
                    bar.advance(task)

            clock = testing.MockClock(autojump_threshold=0)
            results.append(trio.run(_run_stack, label, build, scenario, plan, advance, clock=clock))
    finally:
        if bar is not None:
            bar.stop()
    return results


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
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    return "\n".join(lines)


def plot(results: Sequence[StackStats], path: str) -> None:
    """Each stack's latency distribution (left) and success rate (right), as a PNG."""
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")  # no display needed
    pyplot = require("matplotlib.pyplot", "plot")
    figure, (latency, success) = pyplot.subplots(
        1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]}
    )
    for stats in results:
        count = len(stats.latencies_ms)
        shares = [(index + 1) / count for index in range(count)]
        latency.step(stats.latencies_ms, shares, where="post", label=stats.config)
    latency.set_xscale("log")
    latency.set_xlabel("latency per call (ms, log scale)")
    latency.set_ylabel("share of calls answered or given up by then")
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize="small")
    names = [stats.config for stats in results]
    success.barh(names, [stats.success_rate * 100 for stats in results])
    success.set_xlim(0, 100)
    success.set_xlabel("success (%)")
    success.invert_yaxis()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
