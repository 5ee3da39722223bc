"""The gateways' tests talk to real peers over loopback, in real time, as the
integrations' do: the same fixtures (both anyio backends on their ordinary clocks, the
provider servers started once a session)."""

from tests.integrations.conftest import (
    anyio_backend,
    chat_server,
    chat_server_process,
    messages_server,
    messages_server_process,
)

__all__ = [
    "anyio_backend",
    "chat_server",
    "chat_server_process",
    "messages_server",
    "messages_server_process",
]
