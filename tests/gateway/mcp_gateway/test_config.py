"""A gateway's files: a bad gateway or keys file is one line naming file, key and value
(never a key), and ``describe`` / ``guardstack check`` show the whole gateway without
starting anything."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from guardstack.cli.mcp_gateway import load_gateway
from guardstack.gateway.mcp_gateway import read_gateway, read_keys
from guardstack.pipeline import ConfigError
from tests.gateway.mcp_gateway.gateways import KEY_A, keys_file, tenants, two_servers_and_time
from tests.integrations.test_mcp import ROOT
from tests.integrations.test_mcp_proxy import GUARDSTACK

BAD_GATEWAYS = [
    ({"servers": {"a_b": {"command": "x"}}}, "servers.a_b", "letters, digits and '-'"),
    ({"servers": {"a": {"comand": "x"}}}, "servers.a.comand", "did you mean 'command'"),
    ({"servers": {"a": {"command": "x", "url": "http://h/mcp"}}}, "servers.a", "either"),
    ({"servers": {"a": {"url": "ftp://h"}}}, "servers.a.url", "http:// or https://"),
    ({"servers": {"a": {"command": "x", "timeouts_ms": {"t": -1}}}}, "servers.a.timeouts_ms", "ms"),
    ({"servers": {}}, "servers", "a mapping of server names"),
    ({"servers": {"a": {"command": "x"}}, "plugin": []}, "plugin", "did you mean 'plugins'"),
]

BAD_KEYS = [
    ({"keys": {"short": "t"}, "tenants": {"t": {"servers": {"a": {}}}}}, "16 characters"),
    ({"keys": {KEY_A: "tt"}, "tenants": {"t": {"servers": {"a": {}}}}}, "did you mean 't'"),
    ({"keys": {KEY_A: "t"}, "tenants": {"t": {"servers": {"c": {}}}}}, "no server 'c'"),
    ({"keys": {KEY_A: "t"}, "tenants": {"t": {"servers": {"a": {"tool": ["x"]}}}}}, "tools"),
    (
        {
            "keys": {KEY_A: "t"},
            "tenants": {
                "t": {"servers": {"a": {}}, "quotas": [{"server": "b", "calls_per_day": 1}]}
            },
        },
        "a server this tenant sees",
    ),
    (
        {
            "keys": {KEY_A: "t"},
            "tenants": {
                "t": {"servers": {"a": {}}, "quotas": [{"server": "a", "calls_per_day": 0}]}
            },
        },
        "a whole number >= 1",
    ),
]


@pytest.mark.parametrize(("data", "key", "says"), BAD_GATEWAYS)
def test_a_bad_gateway_file_names_file_key_and_value(
    tmp_path: Path, data: dict[str, Any], key: str, says: str
) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(data), "utf-8")
    with pytest.raises(ConfigError) as raised:
        read_gateway(path)
    assert str(raised.value).startswith(f"{path}: {key}")
    assert says in str(raised.value)


@pytest.mark.parametrize(("data", "says"), BAD_KEYS)
def test_a_bad_keys_file_names_what_is_wrong_and_never_the_keys(
    tmp_path: Path, data: dict[str, Any], says: str
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(data), "utf-8")
    with pytest.raises(ConfigError) as raised:
        read_keys(path, ["a", "b"])
    assert str(raised.value).startswith(f"{path}: ")
    assert says in str(raised.value)
    assert KEY_A not in str(raised.value)  # a key is a secret: never repeated


def test_describe_and_check_show_the_whole_gateway(tmp_path: Path) -> None:
    config = two_servers_and_time(tmp_path)
    keys = keys_file(tmp_path, tenants())
    gateway, _ = load_gateway(config, keys)
    text = gateway.describe()
    checked = subprocess.run(
        [*GUARDSTACK, "check", str(config), "--keys", str(keys)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "servers:\n  a (not started; 0 tools): " in text
    assert "  team-a: a, time (get_current_time); quotas a_echo 2/day" in text
    assert "  team-b: b; quotas b 3/day" in text
    assert "ToolCallTimeoutPolicy" in text
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("servers:\n  a (not started; 0 tools): ")
    assert "team-b: b; quotas b 3/day" in checked.stdout
    assert "2. retry: runs the layers after it again" in checked.stdout


def test_served_names_fit_what_clients_accept_whatever_the_downstream_calls_them() -> None:
    """A property of ``served_names`` over any names: each served name fits
    ``^[a-zA-Z0-9_-]{1,64}$``, starts with its server's, is unique, a name that fits is
    served as it is, and the same names are served alike every time."""
    import re

    from hypothesis import given
    from hypothesis import strategies as st

    from guardstack.gateway.mcp_gateway.config import served_names

    @given(
        server=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9-]{0,39}", fullmatch=True),
        names=st.lists(st.text(min_size=1, max_size=90), max_size=12, unique=True),
    )
    def check(server: str, names: list[str]) -> None:
        served = served_names(server, names)
        assert set(served) == set(names)
        assert len(set(served.values())) == len(names)
        for name, mapped in served.items():
            assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", mapped), mapped
            assert mapped.startswith(f"{server}_")
            if re.fullmatch(r"[A-Za-z0-9_-]+", name) and len(server) + 1 + len(name) <= 64:
                assert mapped == f"{server}_{name}"
        assert served_names(server, list(reversed(names))) == served

    check()
