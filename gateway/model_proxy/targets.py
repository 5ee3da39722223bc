"""An upstream the proxy sends requests to: its name, base URL and key, and its client
(a connection pool; httpx's own transport seam for tests and the demo)."""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT", "Target"]

#: The unnamed upstream's name (``--upstream URL``).
DEFAULT = "default"


class Target:
    """One upstream: its client (a connection pool) and its key."""

    def __init__(
        self, httpx: Any, name: str, url: str, key: str | None, transport: Any = None
    ) -> None:
        self.name, self.url, self.key = name, url.rstrip("/"), key
        # ``transport``: httpx's own seam (an ``ASGITransport`` over an app in process,
        # a ``MockTransport``) for tests and the demo; ``None``: the network
        self.client = httpx.AsyncClient(base_url=self.url, timeout=None, transport=transport)
        #: What the client raises when the upstream cannot be reached or breaks off.
        self.transport_error: type[Exception] = httpx.TransportError
