"""``guardstack spend``: the ledger's report, read with no gateway running — as a table,
JSON (the admin route's) and CSV, by team, key, model and conversation."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from guardstack.cli.main import main
from guardstack.cli.spend import render, spend
from guardstack.gateway.budgets import Budgets
from guardstack.gateway.tenants import tenants_of
from guardstack.integrations.sqlite import SqliteStore
from guardstack.pipeline import ConfigError, Usage

TENANTS: dict[str, Any] = {
    "keys": {
        "sk-acme-alice-0123456789": {"tenant": "acme", "team": "research", "name": "alice"},
        "sk-acme-ci-0123456789abc": {"tenant": "acme", "team": "ci", "name": "ci"},
        "sk-globex-0123456789abcd": "globex",
    },
    "tenants": {
        "acme": {"budget": {"usd_per_day": 10}, "teams": {"research": {}, "ci": {}}},
        "globex": {},
    },
    "prices": {"gpt-x": [10, 30], "gpt-y": [1, 2]},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def spent(path: Path) -> None:
    """Four requests settled in the ledger at ``path``: alice twice on two models, ci
    once, globex once."""
    tenants = tenants_of(TENANTS)
    store = SqliteStore(path)
    budgets = Budgets(tenants, store)
    alice, ci, globex = (tenants.keys[key] for key in TENANTS["keys"])
    try:
        for entry, model, usage, conversation in [
            (alice, "gpt-x", Usage(1_000, 100), "c1"),
            (alice, "gpt-y", Usage(10_000, 1_000), "c1"),
            (ci, "gpt-x", Usage(2_000, 0), "c2"),
            (globex, "gpt-x", Usage(100, 100), "c3"),
        ]:
            held = await budgets.reserve(entry, conversation, model, 10, 100)
            assert not isinstance(held, Exception)
            await budgets.settle(held, usage)  # type: ignore[arg-type]
    finally:
        await store.aclose()


async def test_spend_by_team_key_and_model_from_the_ledger_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    await spent(path)
    store = f"sqlite:{path}"
    by_team = await spend(store, "tenant:acme", "day", "team")
    # alice: $0.013 + $0.012 = $0.025; ci: $0.02
    assert [(r["name"], r["spent_usd"]) for r in by_team["rows"]] == [
        ("acme/research", pytest.approx(0.025)),
        ("acme/ci", pytest.approx(0.02)),
    ]
    assert by_team["spent_usd"] == pytest.approx(0.045)
    by_model = await spend(store, "key:acme/alice", "month", "model")
    assert {r["name"]: r["tokens"] for r in by_model["rows"]} == {"gpt-x": 1_100, "gpt-y": 11_000}
    everyone = await spend(store, None, "day", "tenant")
    assert {r["name"]: r["requests"] for r in everyone["rows"]} == {"acme": 3, "globex": 1}


async def test_the_three_forms_say_the_same(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    await spent(path)
    report = await spend(f"sqlite:{path}", "tenant:acme", "day", "key")
    assert json.loads(render(report, "json")) == report
    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert [(r["name"], float(r["spent_usd"]), int(r["requests"])) for r in rows] == [  # type: ignore[comparison-overlap]
        ("acme/alice", pytest.approx(0.025), 2),
        ("acme/ci", pytest.approx(0.02), 1),
    ]
    table = render(report, "table").splitlines()
    assert table[0].startswith("tenant:acme, this day (")
    assert "$0.0450 spent" in table[0]
    assert table[2].split() == ["acme/alice", "0.0250", "12100", "2"]


def test_the_command_prints_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    path = tmp_path / "ledger.sqlite3"
    anyio.run(spent, path)
    code = main(["spend", "--store", f"sqlite:{path}", "--by", "model", "--format", "csv"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "name,spent_usd,tokens,requests"
    assert [line.split(",")[0] for line in lines[1:]] == ["gpt-x", "gpt-y"]


@pytest.mark.parametrize(
    ("window", "by", "named"),
    [("week", None, "window 'week': day or month"), ("day", "user", "by 'user': one of")],
)
async def test_a_report_that_cannot_be_made_says_why(
    tmp_path: Path, window: str, by: str | None, named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        await spend(f"sqlite:{tmp_path / 'l.sqlite3'}", None, window, by)


async def test_an_empty_ledger_is_an_empty_report(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "new.sqlite3")  # a gateway's, that counted nothing
    await store.read_controls()
    await store.aclose()
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps(TENANTS), "utf-8")
    report = await spend(f"sqlite:{tmp_path / 'new.sqlite3'}", "tenant:acme", "day", "key", tenants)
    assert (report["rows"], report["spent_usd"]) == ([], 0)
    assert "$0.0000 spent" in render(report, "table")


def test_a_mistyped_store_path_is_one_line_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reported: a mistyped path created an empty ledger there and reported $0.0000."""
    missing = tmp_path / "ledgr.sqlite3"
    assert main(["spend", "--store", f"sqlite:{missing}"]) == 2
    err = capsys.readouterr().err
    assert f"no ledger at {missing}" in err
    assert len(err.strip().splitlines()) == 1
    assert not missing.exists()


def test_a_store_that_cannot_be_opened_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "not-a-ledger.sqlite3"
    garbage.write_bytes(b"this is no database\x00" * 100)
    assert main(["spend", "--store", f"sqlite:{garbage}"]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert main(["spend", "--store", "memory"]) == 2
    assert "lives and dies with its gateway" in capsys.readouterr().err


async def test_a_scope_naming_nothing_is_an_error_not_everyones_total(tmp_path: Path) -> None:
    """Reported: ``--scope acme`` printed every tenant's total under the label "acme"."""
    path = tmp_path / "ledger.sqlite3"
    await spent(path)
    for scope in ("acme", "tenant:acmee", "key:alice"):
        with pytest.raises(ConfigError):
            await spend(f"sqlite:{path}", scope, "day", None)
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps(TENANTS), "utf-8")
    with pytest.raises(ConfigError, match="did you mean 'tenant:acme'"):
        await spend(f"sqlite:{path}", "tenant:acmee", "day", None, tenants)


async def test_with_the_tenants_file_each_row_has_its_limit_and_share(tmp_path: Path) -> None:
    """Reported: the CLI's JSON said ``limit_usd: null`` where the admin route on the
    same ledger said the tenant's limit (the CLI could not see the tenants file)."""
    path = tmp_path / "ledger.sqlite3"
    await spent(path)
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps(TENANTS), "utf-8")
    report = await spend(f"sqlite:{path}", "tenant:acme", "day", None, tenants)
    assert report["limit_usd"] == 10.0
    by_tenant = await spend(f"sqlite:{path}", None, "day", "tenant", tenants)
    rows = {row["name"]: row for row in by_tenant["rows"]}
    assert rows["acme"]["limit_usd"] == 10.0
    assert rows["acme"]["share"] == pytest.approx(0.045 / 10, rel=1e-5)
    assert rows["globex"]["limit_usd"] is None
