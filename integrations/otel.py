"""OpenTelemetry in one line, from the standard ``OTEL_*`` environment variables.

    from guardstack.integrations.otel import configure

    telemetry = configure()          # traces and metrics over OTLP/HTTP
    harness.plugin(Tracing())        # the global providers are now the SDK's
    ...
    telemetry.shutdown()             # flush; telemetry.failed_spans says what was lost

What the SDK itself reads is honoured as it is: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (through ``Resource.create``), and
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``…_TRACES_ENDPOINT`` / ``…_METRICS_ENDPOINT``,
``…_HEADERS`` and ``…_TIMEOUT`` (through the OTLP/HTTP exporters). Spans go
through a ``BatchSpanProcessor``, metrics through a
``PeriodicExportingMetricReader``. An export that fails is counted, so a caller
(the CLI does) can say so instead of claiming everything was sent.

Extra ``otlp`` (``pip install 'guardstack[otlp]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from guardstack.integrations._extras import require

if TYPE_CHECKING:  # the SDK is this module's extra, imported when it is used
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["Telemetry", "configure"]

EXTRA = "otlp"


class Telemetry:
    """The SDK providers ``configure`` built, and what their exporters failed to send."""

    def __init__(
        self,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider | None,
        watch: _Watch,
        logger_provider: LoggerProvider | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        #: Where ``Tracing``'s log-based events go (``None`` with ``logs=False``).
        self.logger_provider = logger_provider
        self._watch = watch

    @property
    def failed_spans(self) -> int:
        """Spans an export attempt failed to deliver (after the exporter's own retries)."""
        return self._watch.failed

    @property
    def last_error(self) -> str | None:
        return self._watch.error

    def shutdown(self) -> None:
        """Flush and stop both providers (what is still batched is sent now)."""
        self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()
        if self.logger_provider is not None:
            self.logger_provider.shutdown()


class _Watch:
    def __init__(self) -> None:
        self.failed = 0
        self.error: str | None = None


def _watched(exporter: Any, watch: _Watch) -> Any:
    """A span exporter that counts the spans its exports failed to deliver."""
    export = require("opentelemetry.sdk.trace.export", EXTRA)

    class Watched(export.SpanExporter):  # type: ignore[misc,name-defined]
        def export(self, spans: Sequence[Any]) -> Any:
            try:
                result = exporter.export(spans)
            except Exception as error:  # an exporter must not raise, but be sure
                watch.failed += len(spans)
                watch.error = f"{type(error).__name__}: {error}"
                return export.SpanExportResult.FAILURE
            if result != export.SpanExportResult.SUCCESS:
                watch.failed += len(spans)
                watch.error = "the endpoint did not accept the spans"
            return result

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return Watched()


def configure(
    *,
    service_name: str | None = None,
    traces_endpoint: str | None = None,
    metrics: bool = True,
    logs: bool = True,
    set_global: bool = True,
    readers: Sequence[Any] = (),
) -> Telemetry:
    """Build (and by default install globally) SDK providers exporting over OTLP/HTTP:
    traces, metrics and logs (where ``Tracing``'s events go).

    ``service_name`` is used only when ``OTEL_SERVICE_NAME`` is not set;
    ``traces_endpoint`` overrides the environment's traces endpoint (and, when it ends
    in ``/v1/traces``, the logs go beside it, to ``/v1/logs``); ``readers``: more metric
    readers beside the OTLP one (a gateway's Prometheus reader).
    """
    import os

    require("opentelemetry.exporter.otlp.proto.http", EXTRA)
    from opentelemetry import metrics as metrics_api
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {}
    if service_name is not None and not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = service_name
    resource = Resource.create(attributes)
    watch = _Watch()
    tracer_provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=traces_endpoint)
    tracer_provider.add_span_processor(BatchSpanProcessor(_watched(exporter, watch)))
    meter_provider = None
    if metrics:
        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader, *readers])
    logger_provider = None
    if logs:
        from opentelemetry._logs import set_logger_provider
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

        logs_endpoint = None
        if traces_endpoint is not None and traces_endpoint.endswith("/v1/traces"):
            logs_endpoint = traces_endpoint.removesuffix("/v1/traces") + "/v1/logs"
        logger_provider = LoggerProvider(resource=resource)
        logger_provider.add_log_record_processor(
            BatchLogRecordProcessor(OTLPLogExporter(endpoint=logs_endpoint))
        )
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        if meter_provider is not None:
            metrics_api.set_meter_provider(meter_provider)
        if logger_provider is not None:
            set_logger_provider(logger_provider)
    return Telemetry(tracer_provider, meter_provider, watch, logger_provider)
