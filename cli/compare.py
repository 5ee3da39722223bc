"""``guardstack compare``: your stacks, side by side, on the same seeded faults, in virtual time.

A scenario file (YAML, TOML or JSON) describes the tools — each one's declared
budget, latency, hang and failure probabilities, failure code and idempotency —
and the call mix. Every stack runs the same calls: the *k*-th attempt of call *n*
behaves the same under every stack, drawn from ``--seed``. Time is trio's
``MockClock``, so 10,000 calls with seconds of simulated latency take seconds,
and the same seed gives the same numbers. Per stack: success rate, latency
percentiles, tool runs per call, tool-seconds spent on runs whose result was not
used, and the timeouts by code (whose timer fired).

Scenario keys: ``calls``; ``concurrency`` (how many callers, each making its calls
one after another; default 1); ``give_up_s`` (when the caller stops waiting, default
60); ``tools``: name → ``timeout_ms``, ``latency_ms`` (a number, or ``{median,
p99}`` for a lognormal), ``hang_probability``, ``failure_probability``,
``failure_code`` (default ``TOOL_FAILED``), ``idempotent``, ``capacity`` and
``capacity_change``; ``mix``: tool → weight (default equal).

The provider model (``capacity: {concurrent: K, per_second: R}``, either or both):
a call that arrives while K calls of the tool are running, or finds its R-per-second
token bucket (burst R) empty, is answered ``TOOL_RATE_LIMITED`` after 20 ms with a
Retry-After — 1 s for concurrency, the time to the next token for rate. A call
admitted runs its drawn latency stretched by the load it finds, as a batching
provider's does: ``latency × (1 + ρ²)``, ρ = running calls / K — twice as slow at
capacity, so throughput still grows up to capacity and the best fixed limit is K
(``latency_grows: false``: a hard cap, whose latency stays flat up to it).
``capacity_change: {at_s: T, factor: F}`` (or a list of them) multiplies both
capacities by F from T virtual seconds into the run. Per stack, besides the rest:
goodput (successful calls per virtual second) and 429s per success.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import anyio
import attrs

from guardstack.integrations._extras import require
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness, read_config_file
from guardstack.pipeline.validate import cut, did_you_mean
from guardstack.pipeline.values import (
    INVALID_ARGUMENTS,
    MAX_TIMEOUT_MS,
    TOOL_ABORTED,
    TOOL_FAILED,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolResult,
)
from guardstack.wrappers.retry import seeded_draws

__all__ = [
    "Scenario",
    "StackStats",
    "ToolProfile",
    "compare",
    "figure",
    "load_scenario",
    "plot",
    "render",
    "scenario_budgets",
]

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
    #: The provider model: at most this many at once, and this many per second.
    capacity_concurrent: int | None = None
    capacity_per_second: float | None = None
    #: ``(at_s, factor)``: from ``at_s`` into the run, capacity times ``factor``.
    capacity_changes: tuple[tuple[float, float], ...] = ()
    #: Whether load stretches latency (a batching provider's); ``False``: a hard cap whose
    #: latency stays flat up to it (``capacity: {concurrent: K, latency_grows: false}``).
    latency_grows: bool = True

    def capacity_factor(self, elapsed_s: float) -> float:
        factor = 1.0
        for at_s, change in self.capacity_changes:
            if elapsed_s >= at_s:
                factor = change
        return factor

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
    concurrency: int = 1


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
    #: Successful calls per virtual second, over the whole run.
    goodput_per_s: float = 0.0
    #: How many ``TOOL_RATE_LIMITED`` answers the provider gave per successful call.
    rate_limited_per_success: float = 0.0
    #: ``(virtual second, value)`` of what ``compare(watch=…)`` read, every second.
    watched: tuple[tuple[float, float], ...] = attrs.field(default=(), eq=False, repr=False)
    #: When (virtual seconds into the run) each successful call was answered.
    success_times: tuple[float, ...] = attrs.field(default=(), eq=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        for series in ("latencies_ms", "watched", "success_times"):
            del data[series]
        return data

    def goodput_between(self, start_s: float, end_s: float) -> float:
        """Successful calls per virtual second answered in ``[start_s, end_s)``."""
        done = sum(1 for at in self.success_times if start_s <= at < end_s)
        return done / (end_s - start_s)


#: What a simulated tool may fail with: the codes tools (and guardstack) give.
FAILURE_CODES: Final = (
    TOOL_FAILED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    TOOL_ABORTED,
    INVALID_ARGUMENTS,
)
SCENARIO_KEYS: Final = ("calls", "tools", "mix", "give_up_s", "concurrency")
TOOL_KEYS: Final = (
    "timeout_ms",
    "latency_ms",
    "hang_probability",
    "failure_probability",
    "failure_code",
    "idempotent",
    "capacity",
    "capacity_change",
)
#: The most concurrent callers a scenario may ask for.
MAX_CONCURRENCY: Final = 10_000
#: How long the provider takes to say 429.
REJECT_S: Final = 0.02
#: More calls than this per stack is refused: a run that long is a typo, not a benchmark.
MAX_CALLS: Final = 1_000_000


def _fail(origin: str, where: str, message: str, key: str, value: object = None) -> ConfigError:
    return ConfigError(f"scenario {origin}: {where}{message}", key=key, value=value)


def _number(
    origin: str, where: str, key: str, value: object, low: float, high: float = math.inf
) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        limit = f"from {low:g} to {high:g}" if math.isfinite(high) else f"of at least {low:g}"
        raise _fail(
            origin, where, f"`{key}` must be a finite number {limit}, got {cut(value)}", key, value
        )
    return float(value)


def _unknown_keys(origin: str, where: str, data: Mapping[Any, Any], known: Sequence[str]) -> None:
    for key in data:
        if key not in known:
            raise _fail(
                origin,
                where,
                f"unknown key {cut(key)}{did_you_mean(key, known)}; known keys: {', '.join(known)}",
                str(key),
                data[key],
            )


def load_scenario(source: str | Mapping[str, Any]) -> Scenario:
    """A scenario from a file path (YAML, TOML, JSON) or an already-read mapping.

    Everything is checked before anything runs: unknown keys, tools and codes are
    refused with the file, the key path and a "did you mean", as a ``ConfigError``.
    """
    origin = source if isinstance(source, str) else "<mapping>"
    data = read_config_file(source, "scenario") if isinstance(source, str) else source
    if not isinstance(data, Mapping):
        raise _fail(
            origin, "", f"expected a mapping with a `tools` mapping, got {cut(data)}", "tools"
        )
    _unknown_keys(origin, "", data, SCENARIO_KEYS)
    specs = data.get("tools")
    if not isinstance(specs, Mapping) or not specs:
        raise _fail(
            origin, "", "`tools` must map at least one tool name to its behaviour", "tools", specs
        )
    tools = []
    for name, spec in specs.items():
        where = f"tools.{name}: "
        if not isinstance(name, str) or not name:
            raise _fail(
                origin, "tools: ", f"a tool name must be text, got {cut(name)}", "tools", name
            )
        if not isinstance(spec, Mapping):
            raise _fail(origin, where, f"expected a mapping, got {cut(spec)}", name, spec)
        _unknown_keys(origin, where, spec, TOOL_KEYS)
        latency = spec.get("latency_ms", 100)
        if isinstance(latency, Mapping):
            _unknown_keys(origin, f"tools.{name}.latency_ms: ", latency, ("median", "p99"))
            for part in ("median", "p99"):
                if part not in latency:
                    raise _fail(origin, f"tools.{name}.latency_ms: ", f"`{part}` is missing", part)
            median = _number(origin, where, "latency_ms.median", latency["median"], 0.001)
            p99 = _number(origin, where, "latency_ms.p99", latency["p99"], median)
        else:
            median = p99 = _number(origin, where, "latency_ms", latency, 0.001)
        timeout = spec.get("timeout_ms")
        code = spec.get("failure_code", TOOL_FAILED)
        if code not in FAILURE_CODES:
            raise _fail(
                origin,
                where,
                f"unknown `failure_code` {cut(code)}{did_you_mean(code, FAILURE_CODES)}; "
                f"one of {', '.join(FAILURE_CODES)}",
                "failure_code",
                code,
            )
        idempotent = spec.get("idempotent")
        if idempotent is not None and not isinstance(idempotent, bool):
            raise _fail(
                origin,
                where,
                f"`idempotent` must be true or false, got {cut(idempotent)}",
                "idempotent",
                idempotent,
            )
        hang = _number(origin, where, "hang_probability", spec.get("hang_probability", 0), 0, 1)
        failure = _number(
            origin, where, "failure_probability", spec.get("failure_probability", 0), 0, 1
        )
        if hang + failure > 1:
            raise _fail(
                origin,
                where,
                "`hang_probability` + `failure_probability` is more than 1",
                "failure_probability",
                failure,
            )
        concurrent, per_second, grows = _capacity(origin, where, spec.get("capacity"))
        tools.append(
            ToolProfile(
                name,
                int(_number(origin, where, "timeout_ms", timeout, 1, MAX_TIMEOUT_MS))
                if timeout is not None
                else None,
                median,
                p99,
                hang,
                failure,
                code,
                idempotent,
                concurrent,
                per_second,
                _changes(origin, where, spec.get("capacity_change")),
                grows,
            )
        )
    names = [tool.name for tool in tools]
    mix = data.get("mix") or {}
    if not isinstance(mix, Mapping):
        raise _fail(origin, "", f"`mix` must map tool names to weights, got {cut(mix)}", "mix", mix)
    for name in mix:
        if name not in names:
            raise _fail(
                origin,
                "mix: ",
                f"unknown tool {cut(name)}{did_you_mean(name, names)}; "
                f"the tools are {', '.join(names)}",
                f"mix.{name}",
                name,
            )
    weights = tuple(
        _number(origin, "mix: ", name, mix.get(name, 0 if mix else 1), 0) for name in names
    )
    if not any(weights):
        raise _fail(
            origin, "mix: ", "every weight is 0: no tool would ever be called", "mix", dict(mix)
        )
    calls = check_calls(data.get("calls", 1_000), f"scenario {origin}: `calls`")
    give_up = _number(origin, "", "give_up_s", data.get("give_up_s", 60), 0.001, 86_400)
    concurrency = data.get("concurrency", 1)
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise _fail(
            origin,
            "",
            f"`concurrency` must be a whole number from 1 to {MAX_CONCURRENCY:,}, "
            f"got {cut(concurrency)}",
            "concurrency",
            concurrency,
        )
    return Scenario(tuple(tools), weights, calls, give_up, concurrency)


def _capacity(origin: str, where: str, spec: object) -> tuple[int | None, float | None, bool]:
    if spec is None:
        return None, None, True
    if not isinstance(spec, Mapping) or not spec:
        raise _fail(
            origin,
            where,
            f"`capacity` must be {{concurrent: K, per_second: R}}, got {cut(spec)}",
            "capacity",
            spec,
        )
    _unknown_keys(
        origin,
        f"{where.rstrip(': ')}.capacity: ",
        spec,
        ("concurrent", "per_second", "latency_grows"),
    )
    concurrent = spec.get("concurrent")
    per_second = spec.get("per_second")
    grows = spec.get("latency_grows", True)
    if not isinstance(grows, bool):
        raise _fail(
            origin, where, f"`capacity.latency_grows` must be true or false, got {cut(grows)}",
            "capacity.latency_grows", grows,
        )  # fmt: skip
    return (
        int(_number(origin, where, "capacity.concurrent", concurrent, 1, 1e6))
        if concurrent is not None
        else None,
        _number(origin, where, "capacity.per_second", per_second, 0.001, 1e9)
        if per_second is not None
        else None,
        grows,
    )


def _changes(origin: str, where: str, spec: object) -> tuple[tuple[float, float], ...]:
    if spec is None:
        return ()
    items = spec if isinstance(spec, list) else [spec]
    changes = []
    for item in items:
        if not isinstance(item, Mapping):
            raise _fail(
                origin,
                where,
                f"`capacity_change` must be {{at_s: T, factor: F}} or a list, got {cut(item)}",
                "capacity_change",
                item,
            )
        _unknown_keys(origin, f"{where.rstrip(': ')}.capacity_change: ", item, ("at_s", "factor"))
        at_s = _number(origin, where, "capacity_change.at_s", item.get("at_s"), 0)
        factor = _number(origin, where, "capacity_change.factor", item.get("factor"), 0.001, 1e6)
        changes.append((at_s, factor))
    return tuple(sorted(changes))


def check_calls(value: object, what: str = "--calls") -> int:
    """A number of calls per stack: a whole number from 1 to ``MAX_CALLS``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CALLS:
        raise ConfigError(
            f"{what} must be a whole number from 1 to {MAX_CALLS:,}, got {cut(value)}",
            key="calls",
            value=value,
        )
    return value


@attrs.frozen
class _Plan:
    """Every call's tool and attempt draws, made on demand from the seed and the call's
    index, so each stack sees the same calls and nothing is held for calls not yet run."""

    scenario: Scenario
    seed: int
    calls: int

    def call(self, index: int) -> tuple[str, tuple[tuple[str, float], ...]]:
        rng = random.Random(f"{self.seed}/{index}")
        tools = self.scenario.tools
        [tool] = rng.choices(tools, weights=self.scenario.weights)
        return tool.name, tuple(tool.draw(rng) for _ in range(MAX_ATTEMPTS))


@attrs.define
class _Provider:
    """One simulated tool's provider: what is running now, and its token bucket."""

    profile: ToolProfile
    started: float
    running: int = 0
    tokens: float = 0.0
    refilled: float = 0.0

    def admit(self, now: float) -> float | None:
        """``None`` to run the call, else the Retry-After of a 429."""
        profile = self.profile
        factor = profile.capacity_factor(now - self.started)
        if profile.capacity_concurrent is not None:
            limit = max(1, math.floor(profile.capacity_concurrent * factor))
            if self.running >= limit:
                return 1.0
        if profile.capacity_per_second is not None:
            rate = profile.capacity_per_second * factor
            self.tokens = min(rate, self.tokens + (now - self.refilled) * rate)
            self.refilled = now
            if self.tokens < 1:
                return (1 - self.tokens) / rate
            self.tokens -= 1
        return None

    def stretch(self, now: float) -> float:
        """How much the load a call finds stretches its latency: ``1 + ρ²`` (≤ 2×)."""
        profile = self.profile
        if profile.capacity_concurrent is None or not profile.latency_grows:
            return 1.0
        limit = max(1, profile.capacity_concurrent * profile.capacity_factor(now - self.started))
        load = min(1.0, self.running / limit)
        return 1 + load * load


async def _run_stack(
    label: str,
    build: Callable[[], Harness],
    scenario: Scenario,
    plan: _Plan,
    advance: Callable[[], None],
    watch: Callable[[Harness], float] | None = None,
) -> StackStats:
    with seeded_draws(plan.seed):  # unseeded jitter and chaos: the same draws every run
        harness = build()
    runs: dict[int, list[tuple[float, float]]] = {}
    draws: dict[int, tuple[tuple[str, float], ...]] = {}
    began = anyio.current_time()
    providers = {tool.name: _Provider(tool, began, 0, 0.0, began) for tool in scenario.tools}
    for provider in providers.values():
        provider.tokens = provider.profile.capacity_per_second or 0.0
    limited = 0

    def simulated(profile: ToolProfile) -> Any:
        provider = providers[profile.name]

        async def execute(arguments: Mapping[str, Any], call: ToolCall) -> object:
            nonlocal limited
            index = int(call.call_id)
            kind, seconds = draws[index][min(call.attempt, MAX_ATTEMPTS) - 1]
            started = anyio.current_time()
            retry_after = provider.admit(started)
            if retry_after is not None:
                limited += 1
                await anyio.sleep(REJECT_S)
                error = ToolError(
                    "the provider is at capacity", "RateLimitedError", TOOL_RATE_LIMITED,
                    retry_after_s=retry_after,
                )  # fmt: skip
                return ToolResult(f"Error: {error.message}", True, error)
            seconds *= provider.stretch(started)
            provider.running += 1
            try:
                await anyio.sleep(seconds)
            finally:
                provider.running -= 1
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
    totals = {"runs": 0, "successes": 0}
    wasted = 0.0
    timeouts: dict[str, int] = {}
    indices = iter(range(plan.calls))
    watched: list[tuple[float, float]] = []
    succeeded: list[float] = []

    async def one(index: int) -> None:
        nonlocal wasted
        name, draws[index] = plan.call(index)
        started = anyio.current_time()
        result = None
        with anyio.move_on_after(scenario.give_up_s):
            call = ToolCall(name, {}, str(index), conversation=f"call-{index}")
            result = (await harness.tools.execute(call)).result
        latencies.append(anyio.current_time() - started)
        spent = [end - begin for begin, end in runs.get(index, [])]
        if result is not None and not result.is_error:
            totals["successes"] += 1
            succeeded.append(anyio.current_time() - began)
            spent = spent[:-1]  # the last run's answer was used
        wasted += sum(spent)
        totals["runs"] += len(runs.pop(index, ()))
        del draws[index]
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

    async def caller() -> None:
        for index in indices:  # shared: each caller takes the next call when it is free
            await one(index)

    async def watcher(done: anyio.Event) -> None:
        assert watch is not None
        while not done.is_set():
            watched.append((anyio.current_time() - began, float(watch(harness))))
            with anyio.move_on_after(1.0):
                await done.wait()

    finished = anyio.Event()
    async with anyio.create_task_group() as group:
        if watch is not None:
            group.start_soon(watcher, finished)
        async with anyio.create_task_group() as callers:
            for _ in range(scenario.concurrency):
                callers.start_soon(caller)
        finished.set()
    duration = anyio.current_time() - began
    latencies.sort()
    count = len(latencies)

    def percentile(fraction: float) -> float:
        return latencies[min(count - 1, int(fraction * count))] * 1000

    successes = totals["successes"]
    return StackStats(
        label,
        successes / count,
        percentile(0.50),
        percentile(0.95),
        percentile(0.99),
        totals["runs"] / count,
        wasted,
        dict(sorted(timeouts.items())),
        tuple(latency * 1000 for latency in latencies),
        successes / duration if duration > 0 else 0.0,
        limited / successes if successes else float(limited),
        tuple(watched),
        tuple(succeeded),
    )


def compare(
    stacks: Sequence[tuple[str, Callable[[], Harness]]],
    scenario: Scenario,
    *,
    seed: int = 0,
    calls: int | None = None,
    progress: bool = False,
    watch: Callable[[Harness], float] | None = None,
) -> list[StackStats]:
    """Run every stack on the same seeded calls, each in its own virtual-time trio run.

    ``watch(harness)``, if given, is read every virtual second of each run (an adaptive
    limit's ``current()``, say) into ``StackStats.watched``."""
    trio = require("trio", EXTRA)
    testing = require("trio.testing", EXTRA)
    total = scenario.calls if calls is None else check_calls(calls)
    plan = _Plan(scenario, seed, total)
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
            results.append(
                trio.run(_run_stack, label, build, scenario, plan, advance, watch, clock=clock)
            )
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
    for index, stats in enumerate(results):
        count = len(stats.latencies_ms)
        shares = [(n + 1) / count for n in range(count)]
        colour = colours[index % len(colours)]
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
