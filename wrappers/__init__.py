"""Generic onion layers: timeout, retry, metrics, and tracing instrumentation."""

from guardstack.wrappers.metrics import CALLS_METRIC, DURATION_METRIC, Metrics
from guardstack.wrappers.retry import Retry, RetryBudget, no_backoff
from guardstack.wrappers.timeout import Timeout
from guardstack.wrappers.tracing import BLOCKED_EVENT, CONTEXT_EVENT, DENIED_EVENT, Tracing

__all__ = [
    "BLOCKED_EVENT",
    "CALLS_METRIC",
    "CONTEXT_EVENT",
    "DENIED_EVENT",
    "DURATION_METRIC",
    "Metrics",
    "Retry",
    "RetryBudget",
    "Timeout",
    "Tracing",
    "no_backoff",
]
