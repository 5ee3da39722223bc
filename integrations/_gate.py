"""What a guardstack service that listens checks on every request, before anything else.

A proxy holds a provider key or a team's tools; anything that can reach its port can
spend through it. So on every route:

* **who is asking** — with client keys configured, a known key in ``Authorization``
  (its scheme in any case: ``Bearer``, ``bearer``) or ``x-api-key``, mapped to its
  tenant; an unknown or missing key is 401;
* **not a browser it does not know** — a request carrying an ``Origin`` that is not
  allowed (none is, by default) is 403, and so is one whose ``Host`` is not the listen
  address, ``localhost`` or a loopback address (a rebound DNS name), unless allowed;
* **bounded** — a body declared over the limit is refused from its ``Content-Length``
  before it is read, a body without one is read only up to the limit (413), and a POST
  whose body is not ``application/json`` is 415.

The answers are the service's own error shape (``Refused.status`` and ``.message``;
the service writes them). Nothing here imports a web framework.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any, Final

import attrs

__all__ = ["Gate", "Refused", "client_key", "host_of"]

#: Names every listener answers to besides its own address.
_LOCAL_NAMES: Final = frozenset({"localhost", "localhost.localdomain"})


@attrs.frozen
class Refused(Exception):
    """A request refused at the gate: its HTTP status, a message for the client, and
    the kind of error (``authentication``, ``permission``, ``too_large``, ``media_type``,
    ``invalid_request``)."""

    status: int
    message: str
    kind: str


def host_of(header: str) -> str:
    """The host part of a ``Host`` header: ``[::1]:80`` -> ``::1``, ``a:1`` -> ``a``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@attrs.frozen
class Gate:
    """The checks one listener makes (see the module docstring)."""

    #: The address it listens on (``127.0.0.1``, ``0.0.0.0``, ``::1``, a name).
    listen_host: str = "127.0.0.1"
    #: Client key -> tenant; ``None``: any client, one tenant (no key is checked).
    keys: Mapping[str, str] | None = None
    #: Origins a browser may call from (exactly, ``https://app.example``); none by default.
    allow_origins: Collection[str] = ()
    #: More ``Host`` names it answers to (a name it is reached by, behind a proxy).
    allow_hosts: Collection[str] = ()
    max_body_bytes: int = 4 * 1024 * 1024

    def host_allowed(self, header: str | None) -> bool:
        if header is None:
            return False
        host = host_of(header)
        return (
            host in _LOCAL_NAMES
            or _is_loopback(host)
            or host == self.listen_host.strip("[]").lower()
            or host in {name.lower() for name in self.allow_hosts}
        )

    def check(self, headers: Mapping[str, str], method: str) -> str | None:
        """The request's tenant (``None`` with no keys), or ``Refused``. ``headers`` with
        lower-case names."""
        origin = headers.get("origin")
        if origin is not None and origin not in self.allow_origins:
            raise Refused(403, f"requests from the origin {origin!r} are not allowed", "permission")
        if not self.host_allowed(headers.get("host")):
            raise Refused(
                403, f"requests for the host {headers.get('host')!r} are not allowed", "permission"
            )
        tenant = self.tenant(headers)
        if method == "POST":
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                raise Refused(415, "the body must be application/json", "media_type")
            declared = headers.get("content-length")
            if declared is not None:
                try:
                    size = int(declared)
                except ValueError:
                    raise Refused(
                        400, "Content-Length is not a number", "invalid_request"
                    ) from None
                if size > self.max_body_bytes:
                    raise self.too_large()
        return tenant

    def tenant(self, headers: Mapping[str, str]) -> str | None:
        if self.keys is None:
            return None
        offered = client_key(headers)
        tenant = self.keys.get(offered) if offered else None
        if tenant is None:
            raise Refused(401, "a known client key is needed", "authentication")
        return tenant

    def too_large(self) -> Refused:
        return Refused(413, f"the body is over {self.max_body_bytes} bytes", "too_large")

    async def read(self, chunks: AsyncIterator[bytes]) -> bytes:
        """The body, read only up to the limit (``Refused`` past it)."""
        body = bytearray()
        async for chunk in chunks:
            body += chunk
            if len(body) > self.max_body_bytes:
                raise self.too_large()
        return bytes(body)


def client_key(headers: Mapping[str, str]) -> str:
    """The key a client offers: ``Authorization: <scheme> KEY`` (any scheme's case),
    else ``x-api-key`` (Anthropic's clients), else ``x-goog-api-key`` (the Gemini
    API's); empty when none."""
    authorization = headers.get("authorization", "").strip()
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return key.strip()
    return (headers.get("x-api-key") or headers.get("x-goog-api-key") or "").strip()


async def serve(server: Any) -> None:
    """``await server.serve()`` for a ``uvicorn.Server``, and a SIGTERM (a service
    manager's stop) ends it as gracefully as Ctrl-C: uvicorn finishes what is in flight,
    then *raises the signal again* once it has put the earlier handlers back — with
    Python's default handler the process would die there, before the caller's
    ``finally`` blocks flush telemetry, close the ledger or say goodbye. While it serves,
    the handler it puts back for SIGTERM does nothing, so ``serve`` returns instead."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        await server.serve()
        return
    before = signal.signal(signal.SIGTERM, lambda number, frame: None)
    try:
        await server.serve()
    finally:
        signal.signal(signal.SIGTERM, before)
