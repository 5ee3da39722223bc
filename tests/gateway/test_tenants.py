"""The tenants file (``gateway/tenants.py``): every shape it reads, the tree ``check``
shows, and one line naming file, path and value for each mistake."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from guardstack.gateway.tenants import key_id, read_tenants, tenants_of
from guardstack.pipeline import ConfigError

KEY = "sk-0123456789abcdef"
FILE = """
keys:
  sk-acme-alice-0123456789: {tenant: acme, team: research, name: alice}
  sk-acme-ci-0123456789abc: {tenant: acme, team: ci, name: ci, expires: 2027-01-31}
  sk-globex-0123456789abcd: globex
tenants:
  acme:
    budget: {usd_per_month: 1000, usd_per_day: 80}
    models: [gpt-4o, gpt-4o-mini]
    teams:
      research: {budget: {usd_per_day: 50}}
      ci: {budget: {usd_per_day: 20, tokens_per_minute: 200000, on_limit: wrap_up}}
    servers: {}
    quotas: []
  globex:
    budget: {usd_per_day: 5}
defaults:
  key: {budget: {usd_per_day: 10}}
  conversation: {budget: {usd: 2}}
prices: {gpt-4o: [2.5, 10], gpt-4o-mini: [0.15, 0.6]}
"""


def test_the_designs_file_reads_as_it_says(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(FILE, "utf-8")
    tenants = read_tenants(path)
    alice = tenants.keys["sk-acme-alice-0123456789"]
    assert (alice.id, alice.tenant, alice.team, alice.name) == (
        "acme/alice",
        "acme",
        "research",
        "alice",
    )
    ci = tenants.keys["sk-acme-ci-0123456789abc"]
    day_after = datetime.datetime(2027, 2, 1, tzinfo=datetime.UTC).timestamp()
    assert ci.expired(day_after)  # it works through the day it names, not after
    assert not ci.expired(day_after - 1)
    globex = tenants.keys["sk-globex-0123456789abcd"]
    assert (globex.tenant, globex.id) == ("globex", key_id("sk-globex-0123456789abcd"))
    acme = tenants.tenants["acme"]
    assert acme.budget.limits == {"usd_per_month": 1000.0, "usd_per_day": 80.0}
    assert acme.teams["ci"].budget.on_limit == "wrap_up"
    assert acme.models == frozenset({"gpt-4o", "gpt-4o-mini"})
    assert tenants.key_default.limits == {"usd_per_day": 10.0}
    assert tenants.conversation_default.limits == {"usd": 2.0}
    assert tenants.prices is not None
    assert tenants.prices["gpt-4o"][:2] == (2.5, 10.0)
    assert tenants.describe().splitlines()[:3] == [
        "acme: usd_per_month 1000, usd_per_day 80; models gpt-4o, gpt-4o-mini",
        "  team research: usd_per_day 50",
        "  team ci: usd_per_day 20, tokens_per_minute 200000, wrap up in 1000 tokens",
    ]
    assert "sk-" not in tenants.describe()  # never a key


def test_every_earlier_shape_is_read() -> None:
    flat = tenants_of({"sk-team-a-laptop-0001": "team-a", "sk-team-b-0000000001": "team-b"})
    assert {entry.tenant for entry in flat.keys.values()} == {"team-a", "team-b"}
    gateway = tenants_of(
        {"keys": {"key-team-a-0123456789": "team-a"},
         "tenants": {"team-a": {"servers": {"time": {}}, "quotas": []}}}
    )  # fmt: skip
    assert gateway.tenants["team-a"].servers == {"time": {}}


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"tenants": {"acme": {"budget": {"usd_per_dya": 3}}}},
         "tenants.acme.budget.usd_per_dya: not a budget window (did you mean 'usd_per_day'?)"),
        ({"tenants": {"acme": {"budjet": {}}}},
         "tenants.acme.budjet: not a key here (did you mean 'budget'?)"),
        ({"tenants": {"acme": {}}, "keys": {"sk-0123456789abcdef": "acme2"}},
         "keys.k_", ),
        ({"tenants": {"acme": {}}, "keys": {"short": "acme"}}, "16 characters or more"),
        ({"tenants": {"acme": {"budget": {"usd_per_day": -1}}}}, "a finite number >= 0"),
        ({"tenants": {"acme": {"budget": {"on_limit": "explode"}}}}, "'stop' or 'wrap_up'"),
        ({"tenants": {"a/b": {}}}, "tenants.a/b: a name"),
        ({"tenant": {}}, "tenant: not a key of a tenants file (did you mean 'tenants'?)"),
        ({"tenants": {"acme": {"teams": {"ci": {}}}},
          "keys": {"sk-0123456789abcdef": {"tenant": "acme", "team": "cii"}}},
         "not a team of 'acme' (did you mean 'ci'?)"),
        ({"tenants": {"acme": {}}, "keys": {KEY: {"tenant": "acme", "expires": "soon"}}},
         "a date, YYYY-MM-DD"),
    ],
)  # fmt: skip
def test_a_mistake_is_one_line_naming_path_and_value(data: Any, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        tenants_of(data, "tenants.yaml")
    message = str(raised.value)
    assert message.startswith("tenants.yaml: ")
    assert says in message
    assert "\n" not in message
    assert "sk-0123456789abcdef" not in message  # a key never appears in an error


@pytest.mark.parametrize(
    ("data", "secret"),
    [
        (["sk-acme-alice-0123456789", "sk-acme-bob-00123456789"], "sk-acme"),
        ({"sk-acme-alice-0123456789": 5}, "sk-acme"),
    ],
)
def test_a_bad_file_never_prints_a_client_key(data: Any, secret: str) -> None:
    """Reported (a regression of the file reader): a top level that is a list of keys,
    or ``{KEY: 5}``, was quoted whole in the one-line error."""
    with pytest.raises(ConfigError) as raised:
        tenants_of(data, "tenants.yaml")
    assert secret not in str(raised.value)
    assert str(raised.value).startswith("tenants.yaml: ")


def test_a_name_with_a_newline_is_one_line_in_the_error() -> None:
    with pytest.raises(ConfigError) as raised:
        tenants_of({"tenants": {"acme\nforged": {}}}, "tenants.yaml")
    assert "\n" not in str(raised.value)
    assert "acme\\nforged" in str(raised.value)


def test_a_key_given_to_two_tenants_is_refused_not_the_last_winning(tmp_path: Path) -> None:
    """Reported: a key written twice in ``keys:`` loaded silently, the last tenant
    winning. Any file's mapping that names a key twice is refused, by its line."""
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "keys:\n  sk-acme-alice-0123456789: acme\n  sk-acme-alice-0123456789: globex\n"
        "tenants: {acme: {}, globex: {}}\n",
        "utf-8",
    )
    with pytest.raises(ConfigError) as raised:
        read_tenants(path)
    assert "line 3: a mapping names the key" in str(raised.value)
    assert "sk-acme-alice-0123456789" not in str(raised.value)
    as_json = tmp_path / "tenants.json"
    as_json.write_text(
        '{"keys": {"sk-acme-alice-0123456789": "acme", "sk-acme-alice-0123456789": "globex"},'
        ' "tenants": {"acme": {}, "globex": {}}}',
        "utf-8",
    )
    with pytest.raises(ConfigError, match="names the key 'sk-a'… \\(24 characters\\) twice"):
        read_tenants(as_json)
