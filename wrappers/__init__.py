"""Generic onion layers: timeout, retry, metrics, tracing, and the rest of the resilience family."""

from guardstack.wrappers.adaptive_concurrency_limit import AdaptiveConcurrencyLimit
from guardstack.wrappers.chaos import Chaos, ChaosError
from guardstack.wrappers.circuit_breaker import CircuitBreaker
from guardstack.wrappers.concurrency_limit import ConcurrencyLimit
from guardstack.wrappers.fallback import Fallback
from guardstack.wrappers.hedge import Hedge
from guardstack.wrappers.metrics import CALLS_METRIC, DURATION_METRIC, Metrics
from guardstack.wrappers.rate_limit import RateLimit
from guardstack.wrappers.retry import Retry, RetryBudget, no_backoff, seeded_draws
from guardstack.wrappers.timeout import Timeout
from guardstack.wrappers.token_rate_limit import TokenRateLimit
from guardstack.wrappers.tracing import BLOCKED_EVENT, CONTEXT_EVENT, DENIED_EVENT, Tracing

__all__ = [
    "BLOCKED_EVENT",
    "CALLS_METRIC",
    "CONTEXT_EVENT",
    "DENIED_EVENT",
    "DURATION_METRIC",
    "AdaptiveConcurrencyLimit",
    "Chaos",
    "ChaosError",
    "CircuitBreaker",
    "ConcurrencyLimit",
    "Fallback",
    "Hedge",
    "Metrics",
    "RateLimit",
    "Retry",
    "RetryBudget",
    "Timeout",
    "TokenRateLimit",
    "Tracing",
    "no_backoff",
    "seeded_draws",
]
