"""``guardstack model-proxy`` as a user runs it — the console command in its own process,
an upstream on loopback speaking the provider's wire — for what only the command does:
reading its options and environment, exporting telemetry, keeping a ledger across a
restart, writing its decision log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from openai import AsyncOpenAI

from tests.integrations.chat_server import Answer, ChatServer
from tests.integrations.model_proxy.command import running
from tests.integrations.test_mcp_tracing import Receiver

ASK: Any = [{"role": "user", "content": "What is in the repo?"}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_tracing_layer_exports_to_the_otlp_endpoint_in_the_environment(
    chat_server: ChatServer, tmp_path: Path
) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` set, a ``tracing`` layer in the stack: the model
    call's GenAI span reaches the collector (the proxy sets up the exporter from the
    standard environment, as ``mcp-proxy`` does, and flushes it when stopped)."""
    receiver = Receiver()
    config = tmp_path / "guards.yaml"
    config.write_text("- name: tracing\n", "utf-8")
    chat_server.script = [Answer("Traced.")]
    environment = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "proxy-under-test",
    }
    try:
        async with running(
            ["--config", str(config), "--upstream", chat_server.base_url.removesuffix("/v1")],
            tmp_path,
            environment=environment,
        ) as proxy:  # fmt: skip
            client = AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
            async with client:
                reply = await client.chat.completions.create(model="gpt-x", messages=ASK)
        assert reply.choices[0].message.content == "Traced."
        with anyio.fail_after(10):
            while not any(s.name == "chat gpt-x" for s in receiver.spans):  # noqa: ASYNC110
                await anyio.sleep(0.05)
    finally:
        receiver.close()
