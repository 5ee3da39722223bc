"""Which HTTP client reaches an upstream (``gateway/model_proxy/targets.py``): aiohttp on
asyncio when installed, httpx on trio and over a transport handed in; the same answers
through either, on both backends, with a real upstream on loopback."""

from __future__ import annotations

import importlib
import json
from typing import Any

import anyio
import httpx
import pytest

from guardstack.gateway.model_proxy import DEFAULT, ModelProxy
from guardstack.gateway.model_proxy.targets import Target
from guardstack.pipeline import Harness
from guardstack.pipeline.errors import ConfigError
from tests.integrations.runaway import Runaway

ASK = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


async def _answers(proxy: ModelProxy, stream: bool, text: str = "hello") -> tuple[int, bytes]:
    transport = httpx.ASGITransport(app=proxy.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        answer = await client.post(
            "/v1/chat/completions",
            json={**ASK, "messages": [{"role": "user", "content": text}], "stream": stream},
            headers={"authorization": "Bearer k"},
        )
    return answer.status_code, answer.content


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("client", ["auto", "aiohttp", "httpx"])
async def test_either_client_relays_the_same_answer_on_either_backend(
    anyio_backend_name: str, client: str, stream: bool
) -> None:
    """The upstream's answer reaches the client alike through aiohttp and httpx; on trio
    (where aiohttp cannot run) ``auto`` and ``aiohttp`` reach it through httpx."""
    with Runaway(bound=0, usage=(5, 50)) as upstream:
        proxy = ModelProxy(Harness(), upstream.url, upstream_client=client)
        try:
            status, body = await _answers(proxy, stream)
            used_aiohttp = proxy.upstreams[DEFAULT]._session is not None
        finally:
            await proxy.aclose()
    assert status == 200
    if stream:
        assert body.startswith(b"data: ")
        assert body.rstrip().endswith(b"data: [DONE]")
    else:
        assert b'"choices"' in body
    assert used_aiohttp == (anyio_backend_name == "asyncio" and client != "httpx")


async def test_an_unreachable_upstream_is_the_apis_error_through_either_client(
    anyio_backend_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens there: the API's 502 from either client, never a 500, and the
    decision log says the upstream could not be reached."""
    from tests.integrations.ports import free_port

    for client in ("aiohttp", "httpx"):
        caplog.clear()
        proxy = ModelProxy(Harness(), f"http://127.0.0.1:{free_port()}", upstream_client=client)
        try:
            status, body = await _answers(proxy, False)
        finally:
            await proxy.aclose()
        assert status == 502, (client, status, body)
        assert json.loads(body)["error"]["code"] == "upstream_error"
        assert "upstream 'default' unreachable" in caplog.text, client


def test_a_client_the_proxy_does_not_know_or_cannot_import_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="--upstream-client 'curl': one of auto, aiohttp"):
        Target(httpx, DEFAULT, "http://127.0.0.1:9", None, client="curl")
    real = importlib.import_module

    def without_aiohttp(name: str, *rest: Any) -> Any:
        if name == "aiohttp":
            raise ImportError(name)
        return real(name, *rest)

    monkeypatch.setattr(importlib, "import_module", without_aiohttp)
    with pytest.raises(ConfigError, match=r"needs aiohttp: pip install 'guardstack\[proxy\]'"):
        Target(httpx, DEFAULT, "http://127.0.0.1:9", None, client="aiohttp")
    # auto goes on with httpx
    assert Target(httpx, DEFAULT, "http://127.0.0.1:9", None)._aiohttp is None


def test_the_command_names_a_client_it_does_not_know() -> None:
    import subprocess

    from tests.gateway.model_proxy.command import command

    done = subprocess.run(
        command("model-proxy", "--upstream", "http://127.0.0.1:9", "--upstream-client", "curl"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--upstream-client: invalid choice: 'curl'" in done.stderr


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_session_made_on_one_event_loop_is_not_used_on_another() -> None:
    """A proxy served on one asyncio loop and then on another (each ``anyio.run``) gets
    a session for each: aiohttp's belongs to the loop it was made on."""
    with Runaway(bound=0, usage=(5, 50)) as upstream:
        proxy = ModelProxy(Harness(), upstream.url)
        target = proxy.upstreams[DEFAULT]

        async def once() -> Any:
            status, _ = await _answers(proxy, False)
            assert status == 200
            session = target._session
            await session.close()  # closed with its loop; the target still holds it
            return session

        first = await once()
        second = await anyio.to_thread.run_sync(lambda: anyio.run(once))
        await proxy.aclose()
    assert first is not None
    assert second is not None
    assert first is not second


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
async def test_a_cookie_one_answer_sets_is_never_sent_with_the_next_request(
    chat_server: Any, client: str
) -> None:
    """An upstream's ``Set-Cookie`` on one tenant's answer must not ride along on
    another's request: neither client keeps cookies."""
    from tests.integrations.chat_server import Answer, Fail

    chat_server.script = [
        Fail(429, "slow down", headers={"set-cookie": "__cf_bm=tenant-a; Path=/"}),
        Answer("ok"),
    ]
    proxy = ModelProxy(Harness(), chat_server.base_url.removesuffix("/v1"),
                       upstream_client=client)  # fmt: skip
    try:
        assert (await _answers(proxy, False, "tenant a's"))[0] == 429
        assert (await _answers(proxy, False, "tenant b's"))[0] == 200
    finally:
        await proxy.aclose()
    assert [headers.get("cookie") for headers in chat_server.headers] == [None, None]


def test_the_environments_proxy_is_read_as_httpx_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from guardstack.gateway.model_proxy.targets import proxy_for

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy",
                 "https_proxy", "all_proxy", "no_proxy"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    assert proxy_for("https://api.openai.com") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,.internal")
    assert proxy_for("https://api.openai.com") == "http://proxy.corp:3128"
    assert proxy_for("http://api.openai.com") is None  # HTTP_PROXY is not set
    assert proxy_for("https://llm.internal") is None
    monkeypatch.setenv("ALL_PROXY", "http://all.corp:1")
    assert proxy_for("http://api.openai.com") == "http://all.corp:1"
