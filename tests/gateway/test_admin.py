"""Budgets an operator can read and undo (``gateway/admin.py``), through the model proxy:
``GET /admin/budgets`` lists the overrides, ``GET /admin/budgets/{scope}`` shows one with
its windows, ``DELETE`` removes it so the file's budget applies again; a scope naming
nothing is 404 with a "did you mean"; bad bodies and amounts are 400, never a 503 or a
non-JSON answer; the scope is decoded once; key names with control characters are
refused. A loopback upstream answering with a known usage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from guardstack.gateway.tenants import tenants_of
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import serve
from tests.gateway.test_budgets import ADMIN, CI, TENANTS, anyio_backend, ask, post, runaway
from tests.integrations.runaway import Runaway

HEADERS = {"authorization": f"Bearer {ADMIN}"}
__all__ = ["anyio_backend", "runaway"]  # the budgets tests' fixtures: asyncio, the upstream


async def admin_client(runaway: Runaway) -> AsyncIterator[httpx.AsyncClient]:
    async for served in serve(Harness(), runaway, tenants=tenants_of(TENANTS), admin_key=ADMIN):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as raw:
            yield raw


async def test_an_override_is_listed_read_and_removed(runaway: Runaway) -> None:
    async for raw in admin_client(runaway):
        await post(raw, CI, ask("spend a little"))
        put = await raw.put("/admin/budgets/team:acme/ci", json={"usd_per_day": 2},
                            headers=HEADERS)  # fmt: skip
        listed = await raw.get("/admin/budgets", headers=HEADERS)
        shown = await raw.get("/admin/budgets/team:acme%2Fci", headers=HEADERS)
        removed = await raw.delete("/admin/budgets/team:acme/ci", headers=HEADERS)
        after = await raw.get("/admin/budgets/team:acme/ci", headers=HEADERS)
        again = await raw.delete("/admin/budgets/team:acme/ci", headers=HEADERS)
    assert put.status_code == 200
    assert listed.json() == {
        "overrides": [{"scope": "team:acme/ci", "budget": {"usd_per_day": 2.0}}]
    }
    view = shown.json()
    assert (view["scope"], view["source"], view["budget"]) == (
        "team:acme/ci",
        "override",
        {"usd_per_day": 2.0},
    )
    [window] = view["windows"]
    assert window["window"] == "usd_per_day"
    assert window["unit"] == "usd"
    assert window["limit"] == 2.0
    assert window["spent"] == pytest.approx(0.00155)  # 5 in and 50 out at $10/$30
    assert window["reserved"] == 0
    assert window["remaining"] == pytest.approx(2.0 - 0.00155)
    assert removed.json() == {"scope": "team:acme/ci", "removed": True}
    assert after.json()["source"] == "file"
    assert after.json()["budget"] == {"usd_per_day": 0.006}  # the file's again
    assert again.status_code == 404


@pytest.mark.parametrize(
    ("scope", "hint"),
    [
        ("team:acme/researh", "did you mean 'team:acme/research'"),
        ("tenant:acmee", "did you mean 'tenant:acme'"),
        ("key:alice", "did you mean 'key:acme/alice'"),
    ],
)
async def test_a_scope_naming_nothing_is_404_with_a_did_you_mean(
    runaway: Runaway, scope: str, hint: str
) -> None:
    """Reported: a PUT to a misspelled team answered 200 and changed nothing — an
    operator's typo while stopping a runaway team silently did nothing."""
    async for raw in admin_client(runaway):
        put = await raw.put(f"/admin/budgets/{scope}", json={"usd_per_day": 0}, headers=HEADERS)
        get = await raw.get(f"/admin/budgets/{scope}", headers=HEADERS)
        spend = await raw.get("/admin/spend", params={"scope": scope}, headers=HEADERS)
        listed = await raw.get("/admin/budgets", headers=HEADERS)
    for answer in (put, get, spend):
        assert answer.status_code == 404, answer.text
        assert hint in answer.json()["error"]["message"]
    assert listed.json() == {"overrides": []}  # nothing changed


@pytest.mark.parametrize(
    "body",
    [
        b'{"usd_per_day": 1e400}',
        b'{"usd_per_day": NaN}',
        b'{"usd_per_day": -1}',
        b'{"usd_per_day": "5"}',
        b"[1, 2]",
        b'{"usd_per_dya": 5}',
    ],
)
async def test_a_bad_budget_is_400_and_nothing_is_stored(runaway: Runaway, body: bytes) -> None:
    async for raw in admin_client(runaway):
        answer = await raw.put(
            "/admin/budgets/tenant:acme",
            content=body,
            headers={**HEADERS, "content-type": "application/json"},
        )
        listed = await raw.get("/admin/budgets", headers=HEADERS)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request"
    assert listed.json() == {"overrides": []}


@pytest.mark.parametrize(
    "body",
    [
        {"tenant": ["acme"]},
        {"tenant": "acme", "name": 5},
        {"tenant": "acme", "nmae": "bot"},
        {"tenant": "acme", "name": "bot\nforged row"},
        {"tenant": "acme", "name": "esc\x1b[31m"},
        {"tenant": "acme", "name": "nul\x00"},
        {"tenant": "acme", "name": "alice"},  # acme has an alice already
    ],
)
async def test_a_wrong_key_request_is_400_never_503(runaway: Runaway, body: Any) -> None:
    """Reported: a wrong-typed body answered 503 "the store did not answer"; names with
    control characters the tenants file refuses were issued (a newline forged a row in
    ``guardstack spend``'s table)."""
    async for raw in admin_client(runaway):
        answer = await raw.post("/admin/keys", json=body, headers=HEADERS)
        keys = await raw.get("/admin/keys", headers=HEADERS)
    assert answer.status_code == 400, answer.text
    assert len(keys.json()["keys"]) == 3  # the file's three, none issued


async def test_the_scope_is_percent_decoded_once(runaway: Runaway) -> None:
    """Reported: ``team%253Aacme%252Fci`` set ``team:acme/ci``."""
    async for raw in admin_client(runaway):
        twice = await raw.put("/admin/budgets/team%253Aacme%252Fci", json={"usd_per_day": 1},
                              headers=HEADERS)  # fmt: skip
        listed = await raw.get("/admin/budgets", headers=HEADERS)
    assert twice.status_code == 404
    assert listed.json() == {"overrides": []}


async def test_a_revoked_key_stays_listed_as_revoked(runaway: Runaway) -> None:
    async for raw in admin_client(runaway):
        revoked = await raw.delete("/admin/keys/acme/ci", headers=HEADERS)
        keys = await raw.get("/admin/keys", headers=HEADERS)
        refused = await post(raw, CI, ask("after"))
    assert revoked.json() == {"id": "acme/ci", "revoked": True}
    found = {key["id"]: key["revoked"] for key in keys.json()["keys"]}
    assert found["acme/ci"] is True
    assert found["acme/alice"] is False
    assert refused.status_code == 401


async def test_a_spend_scope_of_an_unknown_kind_is_refused(runaway: Runaway) -> None:
    """Reported: ``bogus:x`` answered 200 with every tenant's spend summed under it."""
    async for raw in admin_client(runaway):
        await post(raw, CI, ask("spend"))
        bogus = await raw.get("/admin/spend", params={"scope": "bogus:x"}, headers=HEADERS)
    assert bogus.status_code == 400
    assert "tenant:NAME" in bogus.json()["error"]["message"]
