"""What the layers report about themselves: events, and the state of the resilience
machinery as metrics.

Every harness has one ``Signals`` (``AgentLoop.signals``, ``Scope.signals``). Layers
report to it; they never know who listens:

* ``event(name, attributes)`` — something a person should see (a reminder, a loop
  detected, a breaker that opened, a store that failed). ``Tracing`` listens and
  writes each as an OpenTelemetry log record (``event_name`` = ``name``, correlated
  with the current span) and, by default, as an event on the current span. With no
  listener an event costs one attribute check.
* ``add(name, value, attributes)`` — a point on one of the instruments in
  ``METRICS`` (a counter, or a histogram);
* ``gauge(name, read)`` — a gauge read when the meter collects: ``read()`` gives
  ``(value, attributes)`` pairs (one per breaker, per limiter key…). Nothing is
  recorded between collections, so a gauge costs nothing per call.

The instruments come from the ``Metrics`` plugin's meter provider once one is applied
(``bind``), else from the global one (the OpenTelemetry API's proxy: a no-op until an
SDK provider is set, then real). Telemetry never changes an outcome: a listener or
instrument that raises is logged and skipped.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final, Literal

import attrs
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.util.types import AttributeValue

from guardstack.pipeline.decisions import decided
from guardstack.pipeline.onion import Registration

__all__ = [
    "BREAKER_STATE",
    "BREAKER_TRANSITIONS",
    "BUDGET_REMAINING_USD",
    "CONCURRENCY_LIMIT",
    "CONTROL_OVERRIDES",
    "EVENTS",
    "LIMITER_QUEUE",
    "LIMITER_WAIT",
    "LOOP_DETECTIONS",
    "METRICS",
    "PROXY_OVERHEAD",
    "PROXY_REQUESTS",
    "REMINDERS",
    "RETRY_ATTEMPTS",
    "SHADOW_ATTRIBUTE",
    "SHADOW_DECISIONS",
    "SHADOW_EVENT",
    "SPEND_USD",
    "STOPS",
    "STORE_ERRORS",
    "STREAM_CUTS",
    "USAGE_TOKENS",
    "USAGE_USD",
    "MetricSpec",
    "Shadow",
    "Signals",
]

BREAKER_STATE: Final = "guardstack.breaker.state"
BREAKER_TRANSITIONS: Final = "guardstack.breaker.transitions"
LIMITER_QUEUE: Final = "guardstack.limiter.queue"
LIMITER_WAIT: Final = "guardstack.limiter.wait"
CONCURRENCY_LIMIT: Final = "guardstack.concurrency.limit"
RETRY_ATTEMPTS: Final = "guardstack.retry.attempts"
REMINDERS: Final = "guardstack.reminders"
LOOP_DETECTIONS: Final = "guardstack.loop.detections"
USAGE_TOKENS: Final = "guardstack.usage.tokens"
USAGE_USD: Final = "guardstack.usage.usd"
STOPS: Final = "guardstack.stops"
SPEND_USD: Final = "guardstack.spend.usd"
BUDGET_REMAINING_USD: Final = "guardstack.budget.remaining.usd"
PROXY_OVERHEAD: Final = "guardstack.proxy.overhead"
PROXY_REQUESTS: Final = "guardstack.proxy.requests"
STREAM_CUTS: Final = "guardstack.stream.cuts"
STORE_ERRORS: Final = "guardstack.store.errors"
SHADOW_DECISIONS: Final = "guardstack.shadow.decisions"
CONTROL_OVERRIDES: Final = "guardstack.control.overrides"
#: The event a layer in shadow mode writes for each decision it did not act on.
SHADOW_EVENT: Final = "guardstack.shadow.decision"
#: The span attribute naming it (the layer and what it would have done).
SHADOW_ATTRIBUTE: Final = "guardstack.shadow.decision"

logger = logging.getLogger("guardstack")

Attributes = Mapping[str, AttributeValue]
Sink = Callable[[str, Attributes, str], None]
Reader = Callable[[], Iterable[tuple[float, Attributes]]]

try:
    #: The instrumentation scope's version: the installed distribution's.
    VERSION = version("guardstack")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    VERSION = "0+unknown"

#: Seconds a call waited for a limiter: from a hundredth of a millisecond (an
#: uncontended admission is microseconds) to a minute (a queue that long is an outage).
WAIT_BUCKETS: Final = (0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                       2.5, 5.0, 10.0, 30.0, 60.0)  # fmt: skip
#: A proxy's own time on a request: 0.1 ms to a second.
OVERHEAD_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                           0.05, 0.1, 0.25, 1.0)  # fmt: skip
#: Attempts per retried operation: every count a retry policy is likely to allow, one
#: bucket each up to 5, then coarser (a storm shows as the top buckets filling).
ATTEMPT_BUCKETS: Final = (2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 20.0)


@attrs.frozen
class MetricSpec:
    """One instrument: its kind, unit (UCUM), description and, for a histogram, its
    bucket boundaries."""

    kind: Literal["counter", "histogram", "gauge"]
    unit: str
    description: str
    buckets: tuple[float, ...] | None = None


#: Every instrument guardstack's layers report on (beyond the GenAI ones ``Metrics``
#: records per call). The dashboard and the docs are checked against this table.
METRICS: Final[dict[str, MetricSpec]] = {
    "guardstack.breaker.state": MetricSpec(
        "gauge", "{state}", "Circuit breaker state: 0 closed, 1 half-open, 2 open"
    ),
    "guardstack.breaker.transitions": MetricSpec(
        "counter", "{transition}",
        "Circuit breaker state changes, by the state entered (the event names the breaker)"
    ),
    "guardstack.limiter.queue": MetricSpec(
        "gauge", "{call}", "Calls waiting for a concurrency or rate limit"
    ),
    "guardstack.limiter.wait": MetricSpec(
        "histogram", "s", "Time a call waited for a limiter before it was admitted or refused",
        WAIT_BUCKETS,
    ),
    "guardstack.concurrency.limit": MetricSpec(
        "gauge", "{call}", "The concurrency an adaptive limit allows now"
    ),
    "guardstack.retry.attempts": MetricSpec(
        "histogram", "{attempt}",
        "Attempts an operation that was retried made, first included (one that worked "
        "first time is not recorded)",
        ATTEMPT_BUCKETS,
    ),
    "guardstack.reminders": MetricSpec(
        "counter", "{reminder}", "Reminders added to the conversation, by pattern"
    ),
    "guardstack.loop.detections": MetricSpec(
        "counter", "{detection}", "Loops a loop guard detected, by pattern"
    ),
    "guardstack.usage.tokens": MetricSpec(
        "counter", "{token}", "Tokens model calls used, by tenant and token type"
    ),
    "guardstack.usage.usd": MetricSpec(
        "counter", "{USD}", "What model calls cost at the configured prices, by tenant"
    ),
    "guardstack.store.errors": MetricSpec(
        "counter", "{error}", "State store operations that failed, by store and policy"
    ),
    "guardstack.shadow.decisions": MetricSpec(
        "counter", "{decision}",
        "What layers in shadow mode would have done and did not, by layer and decision"
    ),
    "guardstack.stops": MetricSpec(
        "counter", "{stop}",
        "Turns a guard or a cap stopped (and budget refusals at a gateway), by layer and tenant"
    ),
    "guardstack.spend.usd": MetricSpec(
        "counter", "{USD}", "What a gateway's requests cost, by tenant, team, key and model"
    ),
    "guardstack.budget.remaining.usd": MetricSpec(
        "gauge", "{USD}", "What is left of a budget's dollars, by scope and window"
    ),
    "guardstack.proxy.overhead": MetricSpec(
        "histogram", "s",
        "The model proxy's own time on a request, the upstream's excluded (its "
        "x-guardstack-overhead-ms header), by wire",
        OVERHEAD_BUCKETS,
    ),
    "guardstack.proxy.requests": MetricSpec(
        "counter", "{request}",
        "Requests the model proxy answered, by wire, upstream and status (a budget's or a "
        "guard's stop is a 200 with x-guardstack-stopped)",
    ),
    "guardstack.stream.cuts": MetricSpec(
        "counter", "{stream}",
        "Upstream streams that broke off after their first byte (the client got the API's "
        "error event), by wire"
    ),
    "guardstack.control.overrides": MetricSpec(
        "gauge", "{override}",
        "Manual overrides in force (a breaker forced, a tool paused, a limit changed), by kind"
    ),
}  # fmt: skip

#: The log-based events, by name (``LogRecord.event_name``), and what each says.
EVENTS: Final[dict[str, str]] = {
    "guardstack.context": "a reminder or notice added to the conversation (source, text)",
    "guardstack.loop_detected": "LoopDetector saw a loop (pattern, tools, repeats, number)",
    "guardstack.denied": "a call a layer denied (reason, whether the turn ends)",
    "guardstack.blocked": "a turn a cap ended (reason)",
    "guardstack.approval": "a person's decision on a call (decision, by, reason, waited)",
    "guardstack.breaker.state_change": "a circuit breaker changed state (key, from, to)",
    "guardstack.store.error": "a state store failed (store, layer, policy, error)",
    "gen_ai.client.operation.exception": "a model call failed (the GenAI conventions' event)",
    "guardstack.tool.exception": "a tool raised (exception type, message, stacktrace)",
    "guardstack.shadow.decision": "a layer in shadow mode would have acted (layer, decision, "
    "what, reason) and let the call through",
    "guardstack.control": "an operator forced a breaker, paused or resumed a tool, or changed "
    "a limit (action, layer, tool)",
    "guardstack.downgrade": "a usage limit past its downgrade point sends calls to the cheaper "
    "model (window, model, fraction)",
    "guardstack.budget_alert": "a gateway's budget past its alert_at, once a window (scope, "
    "window, reason)",
    "gen_ai.guardrail.result": "a guard's decision, as the GenAI conventions' guardrail result "
    "(component, result type and value, reason, source)",
}


class Signals:
    """One harness's events and resilience metrics (see the module)."""

    def __init__(self) -> None:
        self._sinks: list[Sink] = []
        self._gauges: dict[str, list[Reader]] = {}
        self._provider: Any = None
        #: Each counter's ``add``, each histogram's ``record``, by name.
        self._record: dict[str, Callable[[float, Attributes], None]] = {}
        #: The meter reported through (``None``: not yet bound); a rebind silences the
        #: old meter's gauges for this harness.
        self._meter: Any = None

    # -- events -------------------------------------------------------------------------

    @property
    def listened(self) -> bool:
        """Whether an event would reach anyone (build costly attributes only then)."""
        return bool(self._sinks)

    def listen(self, sink: Sink) -> Registration:
        """``sink(name, attributes, severity)`` for every event, until disposed."""
        self._sinks.append(sink)

        def remove() -> None:
            if sink in self._sinks:
                self._sinks.remove(sink)

        return Registration(remove)

    def event(self, name: str, attributes: Attributes, severity: str = "INFO") -> None:
        for sink in list(self._sinks):
            try:
                sink(name, attributes, severity)
            except Exception:
                logger.warning("guardstack: an event listener failed on %s", name, exc_info=True)

    # -- metrics ------------------------------------------------------------------------

    def bind(self, meter_provider: MeterProvider | None) -> None:
        """Report through ``meter_provider`` from now on (the ``Metrics`` plugin's)."""
        self._provider = meter_provider
        self._bind()

    def add(self, name: str, value: float, attributes: Attributes) -> None:
        """A point on the counter or histogram ``name``."""
        if self._meter is None:
            self._bind()
        try:
            self._record[name](value, attributes)
        except Exception:
            logger.warning("guardstack: could not record %s", name, exc_info=True)

    def gauge(self, name: str, read: Reader) -> Registration:
        """Report ``read()`` as the gauge ``name`` at every collection, until disposed."""
        if METRICS[name].kind != "gauge":
            raise ValueError(f"{name} is not a gauge")
        if self._meter is None:
            self._bind()
        readers = self._gauges.setdefault(name, [])
        readers.append(read)

        def remove() -> None:
            if read in readers:
                readers.remove(read)

        return Registration(remove)

    def _bind(self) -> None:
        meter = (
            self._provider.get_meter("guardstack", VERSION)
            if self._provider is not None
            else _global_meter()
        )
        shared = _for_meter(meter)
        shared.signals.add(self)
        self._meter = meter
        self._record = shared.record

    def _observe(self, name: str, meter: Any) -> list[Observation]:
        if meter is not self._meter:
            return []  # rebound: it reports through another meter now
        observations: list[Observation] = []
        for read in list(self._gauges.get(name, ())):
            try:
                observations.extend(
                    Observation(value, dict(attributes)) for value, attributes in read()
                )
            except Exception:
                logger.warning("guardstack: could not read %s", name, exc_info=True)
        return observations


class _Shared:
    """One meter's instruments, made once however many harnesses report through it (an
    instrument made twice is one instrument, and the SDK warns): its gauges read every
    harness bound to it."""

    def __init__(self, meter: Any) -> None:
        self.signals: weakref.WeakSet[Signals] = weakref.WeakSet()
        #: Each counter's ``add``, each histogram's ``record`` (gauges are observed).
        self.record: dict[str, Callable[[float, Attributes], None]] = {}
        for name, spec in METRICS.items():
            if spec.kind == "counter":
                self.record[name] = meter.create_counter(
                    name, unit=spec.unit, description=spec.description
                ).add
            elif spec.kind == "histogram":
                self.record[name] = meter.create_histogram(
                    name,
                    unit=spec.unit,
                    description=spec.description,
                    explicit_bucket_boundaries_advisory=list(spec.buckets or ()),
                ).record
            else:
                meter.create_observable_gauge(
                    name,
                    callbacks=[self._observer(name, meter)],
                    unit=spec.unit,
                    description=spec.description,
                )

    def _observer(
        self, name: str, meter: Any
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [
                observation
                for signals in list(self.signals)
                for observation in signals._observe(name, meter)
            ]

        return observe


_SHARED: weakref.WeakKeyDictionary[Any, _Shared] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


_GLOBAL: list[Any] = []


def _global_meter() -> Any:
    """One meter from the global provider for every harness (the API's proxy gives a new
    one per call; one is enough, and it turns real when an SDK provider is set)."""
    with _SHARED_LOCK:
        if not _GLOBAL:
            _GLOBAL.append(metrics.get_meter_provider().get_meter("guardstack", VERSION))
        return _GLOBAL[0]


def _for_meter(meter: Any) -> _Shared:
    with _SHARED_LOCK:
        shared = _SHARED.get(meter)
        if shared is None:
            shared = _SHARED[meter] = _Shared(meter)
        return shared


class Shadow:
    """A layer application in shadow mode: each decision it would have acted on —
    refuse, wait, deny, remind, end the turn — is recorded (``guardstack.shadow.decisions``
    by layer and decision, a ``guardstack.shadow.decision`` event, the same on the
    current span) and the call goes on unchanged. A new rule can so run on real traffic
    before it acts."""

    __slots__ = ("_attributes", "layer", "signals")

    def __init__(self, layer: str, signals: Signals) -> None:
        self.layer = layer
        self.signals = signals
        self._attributes: dict[str, Attributes] = {}

    def would(self, decision: str, target: str, reason: str = "") -> None:
        """Record that the layer would have done ``decision`` to ``target`` (a tool, a
        model, an agent), because ``reason``."""
        attributes = self._attributes.get(decision)
        if attributes is None:
            attributes = self._attributes[decision] = {
                "guardstack.layer": self.layer,
                "decision": decision,
            }
        signals = self.signals
        signals.add(SHADOW_DECISIONS, 1, attributes)
        said = f"{self.layer}: would {decision} {target}"
        decided("shadow", layer=self.layer, decision=f"would {decision}",
                reason=reason or said, signals=signals)  # fmt: skip
        try:
            span = trace.get_current_span()
            if span.is_recording():
                span.set_attribute(SHADOW_ATTRIBUTE, said)
        except Exception:  # telemetry never changes an outcome
            logger.debug("guardstack: could not mark the span", exc_info=True)
        if signals.listened:
            signals.event(
                SHADOW_EVENT,
                {
                    "guardstack.layer": self.layer,
                    "guardstack.shadow.decision": decision,
                    "guardstack.shadow.target": target,
                    "guardstack.reason": reason,
                },
            )
        logger.info("%s (shadow)%s", said, f": {reason}" if reason else "")
