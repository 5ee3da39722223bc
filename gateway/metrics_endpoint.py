"""``--metrics-listen HOST:PORT``: the gateways' metrics for a Prometheus to scrape.

``GET /metrics`` answers Prometheus' text format — the same names the OTLP export
carries (``guardstack_spend_usd_total``, ``guardstack_budget_remaining_usd``,
``guardstack_stops_total``, ``guardstack_proxy_requests_total`` by wire, upstream and
status, ``guardstack_proxy_overhead_seconds``…), through OpenTelemetry's Prometheus
exporter (the ``prometheus`` extra). It is a route like the gateway's others: the
``Host`` and ``Origin`` checks of its gate, bodies refused, nothing but ``/metrics``;
it shows counts and names of tenants, teams and keys — never a key — so listen on
loopback, or behind whatever guards the gateway's own port.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from guardstack.integrations._extras import require
from guardstack.integrations._gate import Gate, Refused

__all__ = ["metrics_app", "prometheus_reader"]

EXTRA = "prometheus"
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


def prometheus_reader() -> Any:
    """A metric reader exposing what it reads to ``prometheus_client``'s registry."""
    require("opentelemetry.exporter.prometheus", EXTRA)
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    return PrometheusMetricReader()


def meter_provider(readers: Sequence[Any]) -> Any:
    """An SDK meter provider over ``readers``, installed as the global one (guardstack's
    signals report through the global provider unless a ``Metrics`` layer names one)."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    provider = MeterProvider(metric_readers=list(readers))
    metrics.set_meter_provider(provider)
    return provider


def metrics_app(gate: Gate) -> Any:
    """The ASGI app serving ``GET /metrics`` behind ``gate``'s checks."""
    from prometheus_client import REGISTRY, generate_latest
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def refused(status: int, kind: str, message: str) -> Any:
        return JSONResponse({"error": {"type": kind, "message": message}}, status)

    async def scrape(request: Any) -> Any:
        try:
            gate.check(request.headers, "GET")
        except Refused as refusal:
            return refused(refusal.status, refusal.kind, refusal.message)
        return Response(generate_latest(REGISTRY), 200, media_type=TEXT_FORMAT)

    async def elsewhere(request: Any, error: Exception) -> Any:
        status = getattr(error, "status_code", 404)
        return refused(status, "not_found", "only GET /metrics is served here")

    return Starlette(
        routes=[Route("/metrics", scrape, methods=["GET"])],
        exception_handlers={404: elsewhere, 405: elsewhere},
    )


async def serve_metrics(gate: Gate, port: int) -> None:
    """Serve ``metrics_app`` on ``gate.listen_host:port`` until cancelled (the gateway's
    own server keeps the signals: this one never takes them)."""
    import contextlib
    from collections.abc import Iterator

    import uvicorn

    class Quiet(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        metrics_app(gate), host=gate.listen_host, port=port, log_level="warning", lifespan="off"
    )
    await Quiet(config).serve()
