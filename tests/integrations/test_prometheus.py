"""Resilience metrics as Prometheus sees them: through OpenTelemetry's Prometheus
exporter, scraped by a real Prometheus (Debian's ``prometheus``; CI installs it and sets
``GUARDSTACK_PROMETHEUS``), and the Grafana dashboard checked against what is exposed.

Real time: Prometheus scrapes on its own clock (every half second here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from guardstack.pipeline.signals import METRICS
from tests.integrations.ports import free_port, until_listening
from tests.integrations.telemetry_scenario import everything

ROOT = Path(__file__).parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "guardstack-dashboard.json"
PROMETHEUS = os.environ.get("GUARDSTACK_PROMETHEUS") or shutil.which("prometheus")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def exporter() -> Iterator[Any]:
    """A meter provider whose metrics the Prometheus exporter exposes (the registry is
    prometheus_client's global one: the reader is taken out of it afterwards)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY

    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        yield provider
    finally:
        provider.shutdown()  # the reader takes its collector out of the registry
        assert reader._collector not in REGISTRY._collector_to_names


def exposed() -> set[str]:
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}  # fmt: skip


def dashboard_metrics() -> set[str]:
    panels = json.loads(DASHBOARD.read_text("utf-8"))["panels"]
    expressions = [target["expr"] for panel in panels for target in panel["targets"]]
    # metric names, not the label names of `by (…)` groupings and `{…}` matchers
    bare = [re.sub(r"by \([^)]*\)|\{[^}]*\}", "", expr) for expr in expressions]
    return {name for expr in bare
            for name in re.findall(r"\b(?:guardstack|gen_ai)_[a-z0-9_]+", expr)}  # fmt: skip


async def test_every_metric_the_dashboard_reads_is_one_guardstack_exposes(
    exporter: Any, recwarn: Any
) -> None:
    seen: set[str] = set()

    async def look() -> None:
        seen.update(exposed())  # while calls wait at the limiter: the queue gauge

    await everything(exporter, hold_s=0.3, while_held=look)
    seen |= exposed()
    referenced = dashboard_metrics()
    assert referenced, "the dashboard reads no metric"
    assert sorted(referenced - seen) == []
    # and every resilience metric guardstack has is on the dashboard
    bases = {name.removesuffix("_total").removesuffix("_bucket") for name in referenced}
    prometheus_names = {name.replace(".", "_") for name in METRICS}
    missing = [n for n in prometheus_names if not any(b.startswith(n) for b in bases)]
    assert missing == []


async def test_a_real_prometheus_scrapes_the_breaker_the_storm_and_the_queue(
    exporter: Any, tmp_path: Path, recwarn: Any
) -> None:
    if PROMETHEUS is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the Prometheus test: GUARDSTACK_PROMETHEUS is not set")
        pytest.skip("Prometheus is not installed: apt-get install prometheus")
    from prometheus_client import start_http_server

    metrics_port, prometheus_port = free_port(), free_port()
    server, _thread = start_http_server(metrics_port, addr="127.0.0.1")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 500ms, evaluation_interval: 500ms}\n"
        "scrape_configs:\n"
        "  - job_name: guardstack\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n",
        "utf-8",
    )
    command = [
        PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{prometheus_port}",
    ]  # fmt: skip
    process = await anyio.open_process(command, stderr=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{prometheus_port}/api/v1/query"
    found: dict[str, list[Any]] = {}

    async def query(client: httpx.AsyncClient, expr: str) -> list[Any]:
        answer = await client.get(api, params={"query": expr})
        return list(answer.json()["data"]["result"])

    async def until(client: httpx.AsyncClient, name: str, expr: str) -> None:
        with anyio.fail_after(20):
            while not (result := await query(client, expr)):  # noqa: ASYNC110 - polls a server
                await anyio.sleep(0.25)
        found[name] = result

    try:
        await until_listening(prometheus_port)
        async with httpx.AsyncClient() as client:

            async def scraped_while_held() -> None:
                await until(client, "queue", "guardstack_limiter_queue > 0")

            await everything(exporter, hold_s=15, while_held=scraped_while_held)
            await until(client, "open", 'guardstack_breaker_state{key="search"} == 2')
            await until(client, "opened", 'guardstack_breaker_transitions_total{to="open"}')
            await until(client, "storm", 'guardstack_retry_attempts_sum{key="flaky"}')
            await until(client, "waits", "guardstack_limiter_wait_seconds_count > 0")
    finally:
        process.terminate()
        with anyio.fail_after(10):
            await process.wait()
        server.shutdown()
        server.server_close()
    [queue] = found["queue"]
    assert queue["metric"]["key"] == "slow"
    assert float(queue["value"][1]) == 3  # one call runs, three wait
    [opened] = found["opened"]  # the failing tool's breaker, once; flaky's (1 in 2) stays shut
    assert float(opened["value"][1]) == 1
    [storm] = found["storm"]
    assert float(storm["value"][1]) == 5 * 2  # five operations, two attempts each
