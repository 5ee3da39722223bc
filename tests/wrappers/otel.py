"""OpenTelemetry SDK test rigs: spans and metric points kept in memory."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class SpanRig:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def clear(self) -> None:
        self.exporter.clear()


class MetricRig:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def total(self, name: str, **attributes: Any) -> float:
        """Sum of counter points (or histogram counts) whose attributes include ``attributes``."""
        total = 0.0
        for point in self.points(name):
            if all(point.attributes.get(key) == value for key, value in attributes.items()):
                value = getattr(point, "value", None)
                total += value if value is not None else point.count
        return total


class LogRig:
    """Log records (the OpenTelemetry Logs API's events) kept in memory."""

    def __init__(self) -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import (
            InMemoryLogRecordExporter,
            SimpleLogRecordProcessor,
        )

        self.exporter = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]
        self.provider = LoggerProvider()
        self.provider.add_log_record_processor(SimpleLogRecordProcessor(self.exporter))

    def events(self, name: str | None = None) -> list[Any]:
        """The records (``LogRecord``) with this event name, or every one."""
        records = [readable.log_record for readable in self.exporter.get_finished_logs()]
        return [r for r in records if name is None or r.event_name == name]
