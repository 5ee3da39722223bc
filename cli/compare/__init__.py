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

from guardstack.cli.compare.engine import StackStats, compare
from guardstack.cli.compare.report import figure, plot, render, scenario_budgets
from guardstack.cli.compare.scenario import Scenario, ToolProfile, check_calls, load_scenario

__all__ = [
    "Scenario",
    "StackStats",
    "ToolProfile",
    "check_calls",
    "compare",
    "figure",
    "load_scenario",
    "plot",
    "render",
    "scenario_budgets",
]
