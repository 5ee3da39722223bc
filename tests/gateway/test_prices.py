"""Prices from a maintained table (``gateway/prices.py``): a tenants file with no
``prices`` charges each model what ``genai-prices`` says it costs — checked against the
package itself on every wire, through the model proxy — the file's own prices win, and
a model neither knows is charged the file's highest price and named once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from genai_prices import Usage, calc_price

from guardstack.gateway.decision_log import DecisionLog
from guardstack.gateway.prices import maintained_price
from guardstack.gateway.tenants import tenants_of
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import serve
from tests.gateway.model_proxy.test_request import auth, request_for
from tests.integrations.runaway import Runaway

ADMIN = "an-admin-key-of-some-length"
KEY = "sk-acme-priced-0123456789"
USAGE = (1_200, 300)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def upstream() -> Iterator[Runaway]:
    with Runaway(bound=0, usage=USAGE) as running:
        yield running


def tenants(prices: dict[str, Any] | None = None) -> Any:
    data: dict[str, Any] = {
        "keys": {KEY: {"tenant": "acme", "name": "bot"}},
        "tenants": {"acme": {"budget": {"usd_per_day": 100}}},
    }
    if prices is not None:
        data["prices"] = prices
    return tenants_of(data)


@pytest.mark.parametrize(
    ("wire", "model", "provider"),
    [
        ("chat", "gpt-4o", "openai"),
        ("responses", "gpt-4o-mini", "openai"),
        ("messages", "claude-sonnet-4-5", "anthropic"),
        ("gemini", "gemini-2.5-flash", "google"),
    ],
)
async def test_a_file_with_no_prices_charges_what_genai_prices_says(
    upstream: Runaway, wire: str, model: str, provider: str
) -> None:
    """Reported: a tenants file with no ``prices`` charged every request $0, so its
    dollar budgets never bound."""
    async for served in serve(Harness(), upstream, tenants=tenants(), admin_key=ADMIN):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            path, body = request_for(wire, "hi", stream=False)
            if wire == "gemini":
                path = path.replace("/models/m:", f"/models/{model}:")
            else:
                body["model"] = model
            answer = await raw.post(path, json=body, headers=auth(wire, KEY))
            assert answer.status_code == 200, answer.text
            report = await raw.get(
                "/admin/spend", params={"scope": "tenant:acme"},
                headers={"authorization": f"Bearer {ADMIN}"},
            )  # fmt: skip
    expected = calc_price(
        Usage(input_tokens=USAGE[0], output_tokens=USAGE[1]), model, provider_id=provider
    )
    assert report.json()["spent_usd"] == pytest.approx(float(expected.total_price), rel=1e-9)
    assert float(expected.total_price) > 0


async def test_the_files_price_wins_and_an_unknown_model_is_named_once(
    upstream: Runaway,
) -> None:
    log = DecisionLog("off").attach()
    try:
        priced = tenants({"gpt-4o": [1, 1], "house-model": [2, 4]})
        async for served in serve(Harness(), upstream, tenants=priced, admin_key=ADMIN):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
                for model in ("gpt-4o", "no-such-model-x", "no-such-model-x"):
                    path, body = request_for("chat", f"hi {model}", stream=False)
                    body["model"] = model
                    await raw.post(path, json=body, headers=auth("chat", KEY))
                report = await raw.get(
                    "/admin/spend", params={"scope": "tenant:acme", "by": "model"},
                    headers={"authorization": f"Bearer {ADMIN}"},
                )  # fmt: skip
    finally:
        log.detach()
    rows = {row["name"]: row["spent_usd"] for row in report.json()["rows"]}
    assert rows["gpt-4o"] == pytest.approx((1_200 * 1 + 300 * 1) / 1e6)  # the file's
    assert rows["no-such-model-x"] == pytest.approx(2 * (1_200 * 2 + 300 * 4) / 1e6)
    named = [d for d in log.recent if d["event"] == "unpriced"]
    assert [d["model"] for d in named] == ["no-such-model-x"]  # once


def test_a_model_the_table_does_not_know_is_none() -> None:
    assert maintained_price("no-such-model-x") is None
    found = maintained_price("gpt-4o", "openai")
    assert found is not None
    assert found[:2] == (2.5, 10.0)
