"""Integration tests talk to real peers over loopback sockets, so they run in real time.

A virtual clock would jump past every deadline while a real server is still
answering; here the anyio backends run on their ordinary clocks, and each test
keeps its real waits short and bounded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# LiteLLM fetches its cost map and other tables from the network unless told not to:
# nothing in these tests leaves loopback.
for _table in ("MODEL_COST_MAP", "ANTHROPIC_BETA_HEADERS", "BLOG_POSTS", "POLICY_TEMPLATES"):
    os.environ.setdefault(f"LITELLM_LOCAL_{_table}", "True")

from tests.integrations.chat_server import ChatServer  # noqa: E402
from tests.integrations.messages_server import MessagesServer  # noqa: E402


@pytest.fixture(
    params=[pytest.param(("asyncio", {}), id="asyncio"), pytest.param(("trio", {}), id="trio")],
    scope="session",
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture(scope="session")
def chat_server_process() -> Iterator[ChatServer]:
    server = ChatServer()  # one for the run: stopping a server takes half a second
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def chat_server(chat_server_process: ChatServer) -> Iterator[ChatServer]:
    chat_server_process.reset()
    try:
        yield chat_server_process
    finally:
        chat_server_process.reset()


@pytest.fixture(scope="session")
def messages_server_process() -> Iterator[MessagesServer]:
    server = MessagesServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def messages_server(messages_server_process: MessagesServer) -> Iterator[MessagesServer]:
    messages_server_process.reset()
    try:
        yield messages_server_process
    finally:
        messages_server_process.reset()
