"""One gateway for every provider (``gateway/model_proxy/routes.py``): named upstreams,
``--route SELECTOR=NAME`` by wire, model glob or both, the first match winning; no
match and no default is the API's own 404 with nothing forwarded; a route to an
upstream nobody named is refused at start with a "did you mean". Through the console
script, with three loopback upstreams and the official clients, on one ledger."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.gateway.model_proxy.routes import Route, Router, read_route
from guardstack.pipeline.errors import ConfigError
from tests.gateway.model_proxy.command import command, running
from tests.integrations.runaway import Runaway

OPENAI_KEY, ANTHROPIC_KEY = "sk-acme-openai-app-0123", "sk-acme-claude-code-0123"
GEMINI_KEY, OTHER_KEY = "sk-acme-gemini-cli-01234", "sk-globex-someone-012345"
TENANTS: dict[str, Any] = {
    "keys": {
        OPENAI_KEY: {"tenant": "acme", "team": "apps", "name": "app"},
        ANTHROPIC_KEY: {"tenant": "acme", "team": "dev", "name": "claude"},
        GEMINI_KEY: {"tenant": "acme", "team": "dev", "name": "gemini"},
        OTHER_KEY: {"tenant": "globex", "name": "app"},
    },
    "tenants": {"acme": {"teams": {"apps": {}, "dev": {}}}, "globex": {}},
    "prices": {"gpt-x": [1, 2], "claude-x": [3, 15], "gemini-x": [0.5, 1]},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def upstreams() -> Iterator[dict[str, Runaway]]:
    with (
        Runaway(bound=0, usage=(10, 20)) as chat,
        Runaway(bound=0, usage=(10, 20)) as messages,
        Runaway(bound=0, usage=(10, 20)) as gemini,
    ):
        yield {"openai": chat, "anthropic": messages, "gemini": gemini}


def proxy_arguments(upstreams: dict[str, Runaway], tmp_path: Path) -> list[str]:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps(TENANTS), "utf-8")
    arguments = ["--tenants", str(tenants), "--admin-key-env", "ADMIN_KEY"]
    for name, upstream in upstreams.items():
        arguments += ["--upstream", f"{name}={upstream.url}"]
    for route in ("chat=openai", "responses=openai", "messages=anthropic", "gemini=gemini"):
        arguments += ["--route", route]
    return arguments


ADMIN = {"ADMIN_KEY": "an-admin-key-of-some-length"}


async def test_one_gateway_serves_every_wire_each_to_its_own_upstream(
    upstreams: dict[str, Runaway], tmp_path: Path
) -> None:
    """The official OpenAI client (chat and Responses), Anthropic's (Messages) and a
    Gemini request, JSON and streamed, against one process on one ledger: each reaches
    its own upstream and no other, and the spend of all of them is in one report."""
    async with running(proxy_arguments(upstreams, tmp_path), tmp_path, environment=ADMIN) as gw:
        ask: Any = [{"role": "user", "content": "hi"}]
        async with openai.AsyncOpenAI(
            base_url=f"{gw.url}/v1", api_key=OPENAI_KEY, max_retries=0
        ) as client:
            await client.chat.completions.create(model="gpt-x", messages=ask, max_tokens=50)
            stream: Any = await client.chat.completions.create(
                model="gpt-x", messages=ask, max_tokens=50, stream=True
            )
            async for _ in stream:
                pass
            await client.responses.create(model="gpt-x", input="hi", max_output_tokens=50)
        async with anthropic.AsyncAnthropic(
            base_url=gw.url, api_key=ANTHROPIC_KEY, max_retries=0
        ) as claude:
            await claude.messages.create(model="claude-x", max_tokens=50, messages=ask)
            async with claude.messages.stream(
                model="claude-x", max_tokens=50, messages=ask
            ) as streamed:
                await streamed.get_final_message()
        gemini_body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with httpx.AsyncClient(base_url=gw.url) as raw:
            for action in ("generateContent", "streamGenerateContent?alt=sse"):
                answer = await raw.post(
                    f"/v1beta/models/gemini-x:{action}",
                    json=gemini_body,
                    headers={"x-goog-api-key": GEMINI_KEY},
                )
                assert answer.status_code == 200, answer.text
            report = await raw.get(
                "/admin/spend",
                params={"by": "key"},
                headers={"authorization": f"Bearer {ADMIN['ADMIN_KEY']}"},
            )
        said = gw.said()
    paths = {name: [seen.path for seen in up.model_requests()] for name, up in upstreams.items()}
    assert paths["openai"] == ["/v1/chat/completions"] * 2 + ["/v1/responses"]
    assert paths["anthropic"] == ["/v1/messages"] * 2
    assert [path.split(":")[-1] for path in paths["gemini"]] == [
        "generateContent",
        "streamGenerateContent?alt=sse",
    ]
    rows = {row["name"]: row["requests"] for row in report.json()["rows"]}
    assert rows == {"acme/app": 3, "acme/claude": 2, "acme/gemini": 2}
    assert "route messages=anthropic -> " + upstreams["anthropic"].url in said


async def test_a_request_no_route_matches_is_the_apis_404_and_nothing_is_forwarded(
    upstreams: dict[str, Runaway], tmp_path: Path
) -> None:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps(TENANTS), "utf-8")
    anthropic_url = upstreams["anthropic"].url
    arguments = ["--tenants", str(tenants), "--upstream", f"anthropic={anthropic_url}",
                 "--route", "messages=anthropic"]  # fmt: skip
    async with (
        running(arguments, tmp_path) as gw,
        openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=OPENAI_KEY, max_retries=0) as client,
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            await client.chat.completions.create(
                model="gpt-x", messages=[{"role": "user", "content": "hi"}]
            )
    assert "'gpt-x'" in str(refused.value)
    assert "chat" in str(refused.value)
    assert refused.value.response.headers["x-guardstack-overhead-ms"]
    assert all(not up.model_requests() for up in upstreams.values())


def test_a_route_to_an_upstream_nobody_named_is_refused_at_start() -> None:
    done = subprocess.run(
        [*command("model-proxy"), "--upstream", "anthropic=http://127.0.0.1:9",
         "--route", "messages=antropic"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no upstream is named 'antropic'" in done.stderr
    assert "did you mean 'anthropic'" in done.stderr


@given(
    wire=st.sampled_from(["openai", "responses", "anthropic", "gemini"]),
    model=st.text(alphabet="abcdefgh-*.", min_size=0, max_size=12),
)
def test_the_first_route_that_matches_wins_and_else_the_default(wire: str, model: str) -> None:
    routes = [read_route("messages:claude-opus-*=opus"), read_route("messages=claude"),
              read_route("deepseek-*=deepseek"), read_route("gemini=gemini")]  # fmt: skip
    router = Router(routes, {"opus", "claude", "deepseek", "gemini", "default"}, "default")
    chosen = router.choose(wire, model)
    if wire == "anthropic" and model.startswith("claude-opus-"):
        assert chosen == "opus"
    elif wire == "anthropic":
        assert chosen == "claude"
    elif model.startswith("deepseek-"):
        assert chosen == "deepseek"
    elif wire == "gemini":
        assert chosen == "gemini"
    else:
        assert chosen == "default"
    assert (
        Router(routes, {"opus", "claude", "deepseek", "gemini"}, None).choose("openai", "gpt-x")
        is None
    )


def test_a_selector_is_a_wire_a_glob_or_both() -> None:
    assert read_route("chat=a") == Route("chat", None, "a")
    assert read_route("gpt-*=b") == Route(None, "gpt-*", "b")
    assert read_route("responses:o3*=c") == Route("responses", "o3*", "c")
    with pytest.raises(ConfigError, match="did you mean 'messages'"):
        read_route("mesages:claude-*=x")
    with pytest.raises(ConfigError, match="SELECTOR=UPSTREAM"):
        read_route("chat")
