"""The gateways' tests talk to real peers over loopback, in real time, as the
integrations' do: the same fixtures (both anyio backends on their ordinary clocks, the
provider servers started once a session)."""

from collections.abc import Iterator

import pytest

from tests.integrations.conftest import (
    anyio_backend,
    chat_server,
    chat_server_process,
    messages_server,
    messages_server_process,
)
from tests.integrations.responses_server import ResponsesServer

__all__ = [
    "anyio_backend",
    "chat_server",
    "chat_server_process",
    "messages_server",
    "messages_server_process",
    "responses_server",
]


@pytest.fixture(scope="module")
def responses_server() -> Iterator[ResponsesServer]:
    """A Responses API server on loopback, one a test module."""
    server = ResponsesServer()
    try:
        yield server
    finally:
        server.stop()
