"""The MCP gateway with the clients people put in front of it: Claude Code and Codex CLI
as MCP clients (their model a loopback runaway that calls the gateway's tool again and
again), and the MCP Inspector's CLI — all from the npm registry, unpatched. The server
behind the gateway is ``mcp-server-time`` from the package index, whose tools declare
an output schema (so these clients show the model the structured result)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.mcp_gateway.gateways import gateway_file, keys_file, time_server
from tests.gateway.model_proxy.command import Running, started
from tests.integrations import clients
from tests.integrations.runaway import Runaway

KEY = "key-team-a-0123456789"


@pytest.fixture(scope="module")
def installed() -> Path:
    return clients.install()


@contextlib.contextmanager
def gateway(tmp_path: Path, plugins: list[dict[str, object]] | None = None) -> Iterator[Running]:
    config = gateway_file(tmp_path, {"time": time_server()}, plugins or [{"name": "loop-detector"}])
    keys = keys_file(tmp_path, {"team-a": {"servers": {"time": {}}}}, {KEY: "team-a"})
    arguments = ["--config", str(config), "--transport", "http", "--keys", str(keys)]
    with started(arguments, tmp_path, name="mcp-proxy") as running:
        yield running


def reminded(upstream: Runaway) -> list[bool]:
    return ["Potential loop detected" in seen.text() for seen in upstream.model_requests()]


def claude_through(gateway_url: str, base_url: str, home: Path, tool: str) -> clients.Ran:
    """Claude Code with the gateway as its only MCP server, ``tool`` allowed."""
    servers = {"gw": {"type": "http", "url": f"{gateway_url}/mcp",
                      "headers": {"Authorization": f"Bearer {KEY}"}}}  # fmt: skip
    (home / "mcp.json").write_text(json.dumps({"mcpServers": servers}), "utf-8")
    extra = ["--mcp-config", str(home / "mcp.json"), "--strict-mcp-config", "--allowedTools", tool]
    return clients.claude(
        "What time is it?", base_url=base_url, key="sk-any", home=home, extra=extra
    )


def test_claude_code_as_an_mcp_client_shows_the_model_the_gateways_reminder(
    installed: Path, tmp_path: Path
) -> None:
    """Reported: Claude Code shows the model a typed tool's ``structuredContent``, and
    the gateway put its reminder in ``content`` only: no reminder ever reached the
    model. Now the note is in the structured result too (under ``guardstack_note``,
    which the served output schema declares)."""
    tool = "mcp__gw__time_get_current_time"
    with Runaway(bound=6, tool=tool, arguments={"timezone": "UTC"}) as upstream:
        with gateway(tmp_path) as running, clients.folder(tmp_path, "work") as home:
            ran = claude_through(running.url, upstream.url, home, tool)
        notes = reminded(upstream)
    assert ran.returncode == 0, ran.stderr
    assert upstream.calls_made == 6
    assert any(notes), "no reminder reached the model"
    assert not notes[0]  # the first request had nothing to remind of


def test_codex_as_an_mcp_client_shows_the_model_the_gateways_reminder(
    installed: Path, tmp_path: Path
) -> None:
    tool = "mcp__gw/time_get_current_time"  # Codex serves MCP tools in a namespace
    with Runaway(bound=6, tool=tool, arguments={"timezone": "UTC"}) as upstream:
        with gateway(tmp_path) as running, clients.folder(tmp_path, "work") as home:
            ran = clients.codex(
                "What time is it?",
                base_url=upstream.url,
                key="sk-any",
                home=home,
                mcp=("gw", f"{running.url}/mcp", KEY),
            )
        notes = reminded(upstream)
    calls = [e for e in ran.events() if e.get("item", {}).get("type") == "mcp_tool_call"]
    assert calls, ran.stdout[-2000:]
    assert any(notes), "no reminder reached the model"


def test_with_the_model_proxy_in_front_a_loop_the_gateway_sees_ends_the_turn(
    installed: Path, tmp_path: Path
) -> None:
    """Alone the gateway can deny calls but not end the agent's turn (the model keeps
    asking); with the model proxy in front of the model as well, the same agent is
    stopped at the answer that would repeat the loop once more."""
    tool = "mcp__gw__time_get_current_time"
    with Runaway(bound=30, tool=tool, arguments={"timezone": "UTC"}) as upstream:
        guards = tmp_path / "model-guards.yaml"
        guards.write_text("- name: loop-detector\n", "utf-8")
        with (
            gateway(tmp_path) as running,
            started(["--config", str(guards), "--upstream", upstream.url], tmp_path) as proxy,
            clients.folder(tmp_path, "work") as home,
        ):
            ran = claude_through(running.url, proxy.url, home, tool)
    [result] = [event for event in ran.events() if event.get("type") == "result"]
    assert str(result["result"]).startswith("Stopped by loop-detector")
    assert upstream.calls_made <= 10  # where alone the agent made all 30


def test_the_inspector_lists_and_calls_with_its_key_and_a_wrong_key_is_a_bearer_401(
    installed: Path, tmp_path: Path
) -> None:
    """Reported: the gateway's 401 had no ``WWW-Authenticate``. Now it says
    ``Bearer error="invalid_token"`` (RFC 6750); the Inspector in a script
    (``--stored-auth-only``) prints the gateway's own message."""
    with gateway(tmp_path) as running:
        url = f"{running.url}/mcp"
        listed = clients.inspector(url, "--method", "tools/list", key=KEY, home=tmp_path)
        called = clients.inspector(
            url, "--method", "tools/call", "--tool-name", "time_get_current_time",
            "--tool-arg", "timezone=UTC", key=KEY, home=tmp_path,
        )  # fmt: skip
        refused = clients.inspector(
            url, "--stored-auth-only", "--method", "tools/list", key="wrong", home=tmp_path
        )
        raw = httpx.post(url, json={}, headers={"authorization": "Bearer wrong"})
    tools = json.loads(listed.stdout)["tools"]
    [current] = [tool for tool in tools if tool["name"] == "time_get_current_time"]
    assert "guardstack_note" in current["outputSchema"]["properties"]
    assert json.loads(called.stdout)["structuredContent"]["timezone"] == "UTC"
    assert refused.returncode != 0
    assert "a known client key is needed" in refused.stdout + refused.stderr
    assert raw.status_code == 401
    challenge = raw.headers["www-authenticate"]
    assert re.fullmatch(r'Bearer error="invalid_token", error_description=".+"', challenge)
