"""The telemetry guide's screenshots, from a real run: Prometheus' graph of the breaker
and limiter metrics, and Phoenix showing guardstack's events on a trace.

    python -m tests.integrations.screenshots prometheus   # needs Debian's prometheus, chromium
    PLAYWRIGHT_SITE=… python -m tests.integrations.screenshots phoenix PHOENIX_COMMAND

The scenario is ``telemetry_scenario.everything``, run again and again for a couple of
minutes (fresh harnesses each round: each round's breaker opens anew, and its queue
fills), so the graphs have history. Chromium takes the pictures headless.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import warnings
from pathlib import Path

import anyio
import httpx

from tests.integrations.ports import free_port
from tests.integrations.telemetry_scenario import everything

DOCS = Path(__file__).parents[2] / "docs"


def _chromium(url: str, out: Path, size: str = "1400,1000", wait_ms: int = 8000) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={size}", f"--virtual-time-budget={wait_ms}",
         f"--screenshot={out}", url],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    print(f"wrote {out}")


async def _rounds(provider: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await everything(provider, hold_s=4, while_held=None)


def prometheus() -> None:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server

    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed (apt-get install prometheus)")
    metrics_port, prometheus_port = free_port(), free_port()
    start_http_server(metrics_port, addr="127.0.0.1")
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    work = Path(tempfile.mkdtemp())
    config = work / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: agents\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n",
        "utf-8",
    )
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        anyio.run(_rounds, provider, 90.0)
        graphs = {
            "g0.expr": "sum by (to) (increase(guardstack_breaker_transitions_total[15s]))",
            "g1.expr": "sum by (key) (guardstack_limiter_queue)",
        }
        query = {"g0.tab": "0", "g1.tab": "0", "g0.range_input": "2m", "g1.range_input": "2m",
                 **graphs}  # fmt: skip
        url = f"http://127.0.0.1:{prometheus_port}/graph?{urllib.parse.urlencode(query)}"
        _chromium(url, DOCS / "prometheus-resilience.png", size="1300,1560")
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def phoenix(command: str) -> None:
    """A turn with reminders and a loop detection, an opened breaker, traced to Phoenix;
    the picture is of a call's span with its events open (Playwright drives Debian's
    Chromium to click the span's Events tab: ``pip install playwright`` beside it)."""
    import json

    from opentelemetry.sdk.metrics import MeterProvider

    from guardstack.integrations.otel import configure

    port = free_port()
    work = Path(tempfile.mkdtemp())
    environment = {"PHOENIX_PORT": str(port), "PHOENIX_WORKING_DIR": str(work),
                   "PHOENIX_GRPC_PORT": str(free_port()), "PATH": "/usr/bin:/bin"}  # fmt: skip
    process = subprocess.Popen([command, "serve"], env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                httpx.get(f"{url}/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        telemetry = configure(
            service_name="guardstack-events",
            traces_endpoint=f"{url}/v1/traces",
            metrics=False,
            logs=False,
            set_global=False,
        )
        anyio.run(lambda: everything(MeterProvider(), tracer_provider=telemetry.tracer_provider))
        telemetry.shutdown()
        time.sleep(3)

        def graphql(query: str) -> dict:  # type: ignore[type-arg]
            answer = httpx.post(f"{url}/graphql", json={"query": query}, timeout=30)
            return answer.json()["data"]  # type: ignore[no-any-return]

        project = graphql("{ projects { edges { node { id name } } } }")["projects"]["edges"][0]
        project_id = project["node"]["id"]
        spans = graphql(
            f'{{ node(id: "{project_id}") {{ ... on Project {{ spans(first: 500) '
            "{ edges { node { id name context { traceId spanId } "
            "events { name } } } } } } }"
        )["node"]["spans"]["edges"]
        chosen = next(
            edge["node"] for edge in spans
            if any(e["name"] == "guardstack.loop_detected" for e in edge["node"]["events"])
        )  # fmt: skip
        print(json.dumps(chosen))
        page_url = (
            f"{url}/projects/{project_id}/traces/{chosen['context']['traceId']}"
            f"?selectedSpanNodeId={chosen['id']}"
        )
        import os

        if os.environ.get("PLAYWRIGHT_SITE"):  # playwright installed in another environment
            sys.path.append(os.environ["PLAYWRIGHT_SITE"])
        from playwright.sync_api import sync_playwright  # type: ignore[import-not-found]

        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=shutil.which("chromium"))
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            page.goto(page_url)
            page.wait_for_timeout(4000)
            events = page.get_by_role("tab", name=re.compile("Events"))
            if events.count():
                events.first.click()
                page.wait_for_timeout(1000)
                for name in ("guardstack.loop_detected", "guardstack.context"):
                    page.get_by_text(name, exact=True).first.click()  # open its attributes
                    page.wait_for_timeout(500)
            page.screenshot(path=str(DOCS / "phoenix-events.png"))
            browser.close()
        print(f"wrote {DOCS / 'phoenix-events.png'}")
    finally:
        process.terminate()
        process.wait(20)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    if sys.argv[1:2] == ["prometheus"]:
        prometheus()
    elif sys.argv[1:2] == ["phoenix"]:
        phoenix(sys.argv[2])
    else:
        raise SystemExit(__doc__)
