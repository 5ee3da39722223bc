"""The checks every listening service makes before anything else — who is asking, from
which page, for which host, with how big a body — answered in the service's own shape
(a ``Refused`` status, message and kind), never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.integrations._gate import Gate, Refused, client_key, host_of

JSON = {"host": "127.0.0.1:8080", "content-type": "application/json"}


def _refusal(gate: Gate, headers: dict[str, str], method: str = "POST") -> tuple[int, str]:
    with pytest.raises(Refused) as raised:
        gate.check(headers, method)
    return raised.value.status, raised.value.kind


def test_with_keys_a_known_key_names_its_tenant_in_either_header() -> None:
    gate = Gate(keys={"k-1": "team-a"})
    assert gate.check({**JSON, "authorization": "Bearer k-1"}, "POST") == "team-a"
    assert gate.check({**JSON, "authorization": "bearer  k-1 "}, "POST") == "team-a"
    assert gate.check({**JSON, "x-api-key": "k-1"}, "GET") == "team-a"
    assert _refusal(gate, {**JSON, "authorization": "Bearer nope"}) == (401, "authentication")
    assert _refusal(gate, dict(JSON)) == (401, "authentication")
    assert Gate().check(dict(JSON), "POST") is None  # no keys: one tenant, none checked


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"origin": "https://evil.example"}, 403),  # a page it does not know
        ({"host": "rebound.example:8080"}, 403),  # a rebound DNS name
        ({"host": None}, 403),
        ({"content-type": "text/plain"}, 415),
        ({"content-length": "lots"}, 400),
        ({"content-length": str(4 * 1024 * 1024 + 1)}, 413),
    ],
)
def test_each_hostile_request_gets_its_own_answer(
    headers: dict[str, str | None], status: int
) -> None:
    sent = {**JSON, **headers}
    clean = {name: value for name, value in sent.items() if value is not None}
    assert _refusal(Gate(), clean)[0] == status


def test_allowed_origins_and_hosts_and_the_loopback_names_pass() -> None:
    gate = Gate(
        listen_host="0.0.0.0", allow_origins=["https://app.example"], allow_hosts=["Api.Example"]
    )
    for host in ("localhost:1", "[::1]:80", "127.0.0.2", "api.example:443", "0.0.0.0:80"):
        assert gate.check({**JSON, "host": host, "origin": "https://app.example"}, "POST") is None


def test_host_of_and_client_key_read_the_headers_as_sent() -> None:
    assert [host_of(h) for h in ("[::1]:80", "A.example:1", "::1", " x ")] == [
        "::1",
        "a.example",
        "::1",
        "x",
    ]
    assert client_key({"authorization": "Basic abc", "x-api-key": " k "}) == "k"
    assert client_key({}) == ""


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), max_size=8), limit=st.integers(1, 100))
def test_a_body_is_read_only_up_to_the_limit(sizes: list[int], limit: int) -> None:
    gate = Gate(max_body_bytes=limit)
    read: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for size in sizes:
            read.append(size)
            yield b"x" * size

    async def main() -> bytes | int:
        try:
            return await gate.read(chunks())
        except Refused as refused:
            return refused.status

    answer = anyio.run(main)
    if sum(sizes) <= limit:
        assert answer == b"x" * sum(sizes)
    else:
        assert answer == 413
        assert sum(read[:-1]) <= limit  # it stopped at the chunk that went past
