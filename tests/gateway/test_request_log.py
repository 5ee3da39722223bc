"""What operators see of every request (``gateway/request_log.py``, the metrics
endpoint, the decision log): one JSON line per answered request, summed against
``/admin/spend``; ``/metrics`` read by prometheus-client's own parser; a refused key
and a failing upstream each a decision line; the overhead header on every answer.
Through the console script and in process, against loopback upstreams."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from guardstack.gateway.decision_log import DecisionLog
from guardstack.gateway.request_log import FIELDS
from guardstack.gateway.tenants import tenants_of
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.command import running
from tests.gateway.model_proxy.test_app import serve
from tests.gateway.model_proxy.test_request import auth, request_for
from tests.integrations.ports import free_port, until_listening
from tests.integrations.runaway import Runaway

KEY = "sk-acme-ci-bot-0123456789"
SECRET_TEXT = "the launch codes are 0000"
TENANTS: dict[str, Any] = {
    "keys": {KEY: {"tenant": "acme", "team": "ci", "name": "bot"}},
    "tenants": {"acme": {"teams": {"ci": {"budget": {"usd_per_day": 1}}}}},
    "prices": {"m": [10, 30]},
}
ADMIN = "an-admin-key-of-some-length"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def upstream() -> Iterator[Runaway]:
    with Runaway(bound=0, usage=(100, 50)) as running_upstream:
        yield running_upstream


async def test_each_request_is_one_line_summing_to_the_spend_report(
    upstream: Runaway, tmp_path: Path
) -> None:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps(TENANTS), "utf-8")
    log = tmp_path / "requests.jsonl"
    metrics_port = free_port()
    arguments = ["--upstream", upstream.url, "--tenants", str(tenants), "--request-log",
                 str(log), "--metrics-listen", f"127.0.0.1:{metrics_port}",
                 "--admin-key-env", "ADMIN"]  # fmt: skip
    async with running(arguments, tmp_path, environment={"ADMIN": ADMIN}) as gateway:
        await until_listening(metrics_port)
        async with httpx.AsyncClient(base_url=gateway.url) as raw:
            for wire in ("chat", "responses", "messages", "gemini"):
                for stream in (False, True):
                    path, body = request_for(wire, SECRET_TEXT, stream=stream)
                    answer = await raw.post(path, json=body, headers=auth(wire, KEY))
                    assert answer.status_code == 200
            wrong = {"authorization": "Bearer wrong-key-0123456789"}
            refused = await raw.post("/v1/chat/completions", json=body, headers=wrong)
            spend = await raw.get("/admin/spend", params={"scope": "tenant:acme"},
                                  headers={"authorization": f"Bearer {ADMIN}"})  # fmt: skip
            scraped = await raw.get(f"http://127.0.0.1:{metrics_port}/metrics")
            elsewhere = await raw.get(f"http://127.0.0.1:{metrics_port}/admin/spend")
            browser = await raw.get(
                f"http://127.0.0.1:{metrics_port}/metrics",
                headers={"origin": "https://evil.example"},
            )
        said = gateway.said()
    lines = [json.loads(line) for line in log.read_text("utf-8").splitlines()]
    assert len(lines) == 9  # eight answered, one refused key
    assert all(tuple(line) == FIELDS for line in lines)
    answered = [line for line in lines if line["status"] == 200]
    assert {line["wire"] for line in answered} == {"chat", "responses", "messages", "gemini"}
    assert {line["stream"] for line in answered} == {True, False}
    assert all((line["tenant"], line["team"], line["key_name"]) == ("acme", "ci", "acme/bot")
               for line in answered)  # fmt: skip
    usage = {(line["wire"], line["stream"]): (line["input_tokens"], line["output_tokens"])
             for line in answered}  # fmt: skip
    assert set(usage.values()) == {(100, 50)}, sorted(usage.items())
    assert sum(line["usd"] for line in answered) == pytest.approx(spend.json()["spent_usd"])
    assert [line["status"] for line in lines if line["status"] != 200] == [401]
    assert SECRET_TEXT not in log.read_text("utf-8")
    assert KEY not in log.read_text("utf-8")
    # the refused key: a decision line, its overhead on the answer
    assert refused.status_code == 401
    assert refused.headers["x-guardstack-overhead-ms"]
    assert '"unauthorized"' in said
    # the metrics, as Prometheus' own parser reads them
    from prometheus_client.parser import text_string_to_metric_families

    families = {family.name: family for family in text_string_to_metric_families(scraped.text)}
    requests = families["guardstack_proxy_requests"]
    counted = {
        (sample.labels["wire"], sample.labels["status"]): sample.value
        for sample in requests.samples
        if sample.name.endswith("_total")
    }
    assert counted[("chat", "200")] == 2
    assert counted[("chat", "401")] == 1
    assert "guardstack_spend_usd" in families
    assert elsewhere.status_code == 404
    assert browser.status_code == 403


async def test_a_failing_upstream_is_a_decision_line(tmp_path: Path) -> None:
    """Reported: an upstream that was down left no line anywhere."""
    log = DecisionLog("off").attach()
    try:
        with Runaway(bound=0) as upstream:
            upstream.fail = 503
            async for served in serve(Harness(), upstream, tenants=tenants_of(TENANTS)):
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                    path, body = request_for("chat", "hi", stream=False)
                    failed = await raw.post(path, json=body, headers=auth("chat", KEY))
        dead = free_port()  # nothing listens there
        harness = Harness()
        proxy_options: dict[str, Any] = {"tenants": tenants_of(TENANTS)}

        class Nowhere:
            base_url = f"http://127.0.0.1:{dead}"

        async for served in serve(harness, Nowhere(), **proxy_options):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                path, body = request_for("chat", "hi again", stream=False)
                unreachable = await raw.post(path, json=body, headers=auth("chat", KEY))
    finally:
        log.detach()
    assert (failed.status_code, unreachable.status_code) == (503, 502)
    lines = [d for d in log.recent if d["event"] == "upstream_failed"]
    assert [line["decision"] for line in lines] == ["503", "MODEL_UNAVAILABLE"]
    assert all(line["key_name"] == "acme/bot" for line in lines)
    assert "default" in lines[1]["reason"]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status"),
    [
        ("/v1/chat/completions", b"{}", {"content-type": "application/json"}, 400),
        ("/v1/chat/completions", b"{}", {"authorization": "Bearer nope-0123456789abcdef"}, 401),
        ("/v1/chat/completions", b"hi", {"content-type": "text/plain"}, 415),
        ("/v1beta/models/m:countTokens", b"{}", {}, 404),
    ],
)
async def test_the_overhead_header_is_on_the_proxys_own_answers(
    upstream: Runaway, path: str, body: bytes, headers: dict[str, str], status: int
) -> None:
    async for served in serve(Harness(), upstream, tenants=tenants_of(TENANTS)):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            auth_headers = auth("chat", KEY) if "authorization" not in headers else {}
            answer = await raw.post(path, content=body, headers={**auth_headers, **headers})
    assert answer.status_code == status, answer.text
    assert float(answer.headers["x-guardstack-overhead-ms"]) >= 0


async def test_a_wrong_key_retried_is_one_line_a_second(upstream: Runaway) -> None:
    log = DecisionLog("off").attach()
    try:
        async for served in serve(Harness(), upstream, tenants=tenants_of(TENANTS)):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                with anyio.fail_after(10):
                    wrong = {"authorization": "Bearer wrong-0123456789ab"}
                    for _ in range(20):
                        await raw.post("/v1/chat/completions", json={}, headers=wrong)
    finally:
        log.detach()
    refused = [d for d in log.recent if d["decision"] == "unauthorized"]
    assert 1 <= len(refused) <= 2  # twenty refusals inside a second or two
    assert "wrong-0123456789ab" not in json.dumps(refused)
