"""A ``compare`` scenario: the simulated tools, their provider, the call mix, read
and checked from a file (every mistake a ``ConfigError`` naming the key)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import read_config_file
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
)

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
    #: A streamed answer (``stream:``): the first byte's latency (median, p99; ms), a
    #: progress report every ``chunk_ms`` after it, and the chance that the stream stalls
    #: part-way (reports stop, the call hangs). ``None``: the tool does not stream.
    stream: Stream | None = None

    def capacity_factor(self, elapsed_s: float) -> float:
        factor = 1.0
        for at_s, change in self.capacity_changes:
            if elapsed_s >= at_s:
                factor = change
        return factor

    def draw(self, rng: random.Random) -> Attempt:
        """One attempt: ``hang``, ``fail`` or ``ok`` after ``seconds`` (a stream's first
        byte and stall drawn after, so a scenario without streams draws as before)."""
        roll = rng.random()
        seconds = _lognormal(rng, self.latency_median_ms, self.latency_p99_ms)
        kind = "ok"
        if roll < self.hang_probability:
            kind, seconds = "hang", math.inf
        elif roll < self.hang_probability + self.failure_probability:
            kind = "fail"
        stream = self.stream
        if stream is None:
            return Attempt(kind, seconds)
        first = min(_lognormal(rng, *stream.first_byte_ms), seconds)
        stall = rng.random() < stream.stall_probability
        stall_at = first + rng.random() * (seconds - first) if stall and kind != "hang" else None
        return Attempt(kind, seconds, first, stall_at)


def _lognormal(rng: random.Random, median_ms: float, p99_ms: float) -> float:
    """Seconds, drawn from a lognormal with this median and 99th percentile (in ms)."""
    sigma = math.log(p99_ms / median_ms) / _Z99
    return median_ms * math.exp(sigma * rng.gauss(0, 1)) / 1000


@attrs.frozen
class Stream:
    """How a streaming tool answers (``tools.NAME.stream``)."""

    first_byte_ms: tuple[float, float]
    chunk_ms: float
    stall_probability: float = 0.0


@attrs.frozen
class Attempt:
    """What one attempt of a call does: ``kind`` after ``seconds``; a stream's first
    piece after ``first_byte_s`` and, if it stalls, no piece after ``stall_at_s``."""

    kind: str
    seconds: float
    first_byte_s: float | None = None
    stall_at_s: float | None = None


@attrs.frozen
class Tenant:
    """Whose calls (``tenants.NAME``): its share of the calls and their priority."""

    name: str
    share: float = 1.0
    priority: int = 0


@attrs.frozen
class Scenario:
    tools: tuple[ToolProfile, ...]
    weights: tuple[float, ...]
    calls: int = 1_000
    give_up_s: float = 60.0
    concurrency: int = 1
    #: Whose the calls are (``tenants:``), each call drawn by share; none: one tenant.
    tenants: tuple[Tenant, ...] = ()


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
SCENARIO_KEYS: Final = ("calls", "tools", "mix", "give_up_s", "concurrency", "tenants")
TOOL_KEYS: Final = (
    "timeout_ms",
    "latency_ms",
    "hang_probability",
    "failure_probability",
    "failure_code",
    "idempotent",
    "capacity",
    "capacity_change",
    "stream",
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
        median, p99 = _latency(origin, name, "latency_ms", spec.get("latency_ms", 100))
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
                _stream(origin, name, spec.get("stream")),
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
    return Scenario(
        tuple(tools), weights, calls, give_up, concurrency, _tenants(origin, data.get("tenants"))
    )


def _latency(origin: str, tool: str, key: str, value: object) -> tuple[float, float]:
    """A latency in ms: a number, or ``{median, p99}`` for a lognormal."""
    where = f"tools.{tool}: "
    if isinstance(value, Mapping):
        _unknown_keys(origin, f"tools.{tool}.{key}: ", value, ("median", "p99"))
        for part in ("median", "p99"):
            if part not in value:
                raise _fail(origin, f"tools.{tool}.{key}: ", f"`{part}` is missing", part)
        median = _number(origin, where, f"{key}.median", value["median"], 0.001)
        return median, _number(origin, where, f"{key}.p99", value["p99"], median)
    fixed = _number(origin, where, key, value, 0.001)
    return fixed, fixed


def _stream(origin: str, tool: str, spec: object) -> Stream | None:
    """``stream: {first_byte_ms, chunk_ms, stall_probability}``."""
    if spec is None:
        return None
    where = f"tools.{tool}.stream: "
    if not isinstance(spec, Mapping):
        raise _fail(
            origin, where, f"expected {{first_byte_ms, chunk_ms, stall_probability}}, got "
            f"{cut(spec)}", "stream", spec,
        )  # fmt: skip
    _unknown_keys(origin, where, spec, ("first_byte_ms", "chunk_ms", "stall_probability"))
    for needed in ("first_byte_ms", "chunk_ms"):
        if needed not in spec:
            raise _fail(origin, where, f"`{needed}` is missing", needed)
    return Stream(
        _latency(origin, tool, "stream.first_byte_ms", spec["first_byte_ms"]),
        _number(origin, where, "chunk_ms", spec["chunk_ms"], 0.001),
        _number(origin, where, "stall_probability", spec.get("stall_probability", 0), 0, 1),
    )


def _tenants(origin: str, spec: object) -> tuple[Tenant, ...]:
    """``tenants: {NAME: {share, priority}}``."""
    if spec is None:
        return ()
    if not isinstance(spec, Mapping) or not spec:
        raise _fail(
            origin, "", f"`tenants` must map tenant names to {{share, priority}}, got {cut(spec)}",
            "tenants", spec,
        )  # fmt: skip
    found = []
    for name, entry in spec.items():
        where = f"tenants.{name}: "
        if not isinstance(name, str) or not name:
            raise _fail(origin, "tenants: ", f"a tenant name must be text, got {cut(name)}",
                        "tenants", name)  # fmt: skip
        entry = {} if entry is None else entry
        if not isinstance(entry, Mapping):
            raise _fail(
                origin, where, f"expected {{share, priority}}, got {cut(entry)}", name, entry
            )
        _unknown_keys(origin, where, entry, ("share", "priority"))
        priority = entry.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise _fail(origin, where, f"`priority` must be a whole number, got {cut(priority)}",
                        "priority", priority)  # fmt: skip
        share = _number(origin, where, "share", entry.get("share", 1), 0.001)
        found.append(Tenant(name, share, priority))
    return tuple(found)


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
