"""Generic onion layers: timeout, retry, metrics, and tracing instrumentation."""

from wrappers.metrics import CALLS_METRIC, DURATION_METRIC, Metrics
from wrappers.retry import Retry, RetryBudget, no_backoff
from wrappers.timeout import Timeout, within_budget
from wrappers.tracing import CONTEXT_EVENT, Tracing

__all__ = [
    "CALLS_METRIC",
    "CONTEXT_EVENT",
    "DURATION_METRIC",
    "Metrics",
    "Retry",
    "RetryBudget",
    "Timeout",
    "Tracing",
    "no_backoff",
    "within_budget",
]
