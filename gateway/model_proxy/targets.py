"""An upstream the proxy sends requests to: its name, base URL and key, and the client
that reaches it.

**Two HTTP clients, one seam.** A request's POST goes out through aiohttp when the proxy
runs on asyncio and aiohttp is installed (the ``proxy`` extra brings it), through httpx
otherwise — on trio, or when the caller hands an httpx transport (an ``ASGITransport``
over an app in process: tests, the demo). Chosen by measurement: aiohttp's client costs
the proxy about 0.8 ms less CPU per request than httpx's on the same server
(``benchmarks.model_proxy --client``, docs/speed.md). Either answers with the same small
``Answer`` (status, headers, the body whole or as it arrives, closed once); what either
raises when the upstream cannot be reached or breaks off is in ``transport_errors``.
The model listing and Anthropic's token counting stay on httpx: they are rare.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import importlib
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from guardstack.pipeline.errors import ConfigError

__all__ = ["CLIENTS", "DEFAULT", "Answer", "Target"]

#: The unnamed upstream's name (``--upstream URL``).
DEFAULT = "default"
#: ``--upstream-client``: which HTTP client reaches the upstreams.
CLIENTS = ("auto", "aiohttp", "httpx")
#: How many connections aiohttp's pool opens to one upstream at most (httpx's own
#: default is 100; a proxy serving more streams at once than that would queue them).
MOST_CONNECTIONS = 1_000


class Answer(Protocol):
    """An upstream's answer, once its status and headers came."""

    status_code: int
    headers: Mapping[str, str]

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class _AiohttpAnswer:
    """aiohttp's response as an ``Answer``: the body as it arrives, decoded."""

    __slots__ = ("_response", "headers", "status_code")

    def __init__(self, response: Any) -> None:
        self._response = response
        self.status_code: int = response.status
        self.headers: Mapping[str, str] = response.headers

    async def aread(self) -> bytes:
        return bytes(await self._response.read())

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._response.content.iter_any()  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        response = self._response
        if response.content.at_eof():
            response.release()  # read to its end: the connection goes back to the pool
        else:
            response.close()  # left partway: the connection cannot be used again


def _no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that keeps nothing: an upstream's cookie set on one tenant's answer
    is never sent with another's request."""
    return http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def proxy_for(url: str) -> str | None:
    """The HTTP proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, less ``NO_PROXY``), as httpx reads it; ``None``: straight there."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


def _aiohttp(client: str, transport: Any) -> Any:
    """The aiohttp module when this target uses it, else ``None``."""
    if client == "httpx" or transport is not None:
        return None
    try:
        return importlib.import_module("aiohttp")
    except ImportError:
        if client == "aiohttp":
            raise ConfigError(
                "model-proxy: --upstream-client aiohttp needs aiohttp: "
                "pip install 'guardstack[proxy]'",
                key="upstream-client",
                value=client,
            ) from None
        return None


class Target:
    """One upstream: the clients that reach it (connection pools) and its key."""

    def __init__(
        self,
        httpx: Any,
        name: str,
        url: str,
        key: str | None,
        transport: Any = None,
        *,
        client: str = "auto",
    ) -> None:
        if client not in CLIENTS:
            raise ConfigError(
                f"model-proxy: --upstream-client {client!r}: one of {', '.join(CLIENTS)}",
                key="upstream-client",
                value=client,
            )
        self.name, self.url, self.key = name, url.rstrip("/"), key
        # ``transport``: httpx's own seam (an ``ASGITransport`` over an app in process,
        # a ``MockTransport``) for tests and the demo; ``None``: the network
        self.client = httpx.AsyncClient(
            base_url=self.url, timeout=None, transport=transport, cookies=_no_cookies()
        )
        self._aiohttp = _aiohttp(client, transport)
        #: What the clients raise when the upstream cannot be reached or breaks off.
        self.transport_errors: tuple[type[Exception], ...] = (httpx.TransportError,)
        if self._aiohttp is not None:
            self.transport_errors += (self._aiohttp.ClientError,)
        #: aiohttp's session and the event loop it belongs to (made on first use).
        self._session: Any = None
        self._loop: Any = None
        self._proxy: str | None = None
        self._ssl: Any = None
        self._httpx = httpx

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """``body`` POSTed to ``path``: the answer once its status and headers came."""
        session = self._aiohttp_session()
        if session is None:
            request = self.client.build_request("POST", path, content=body, headers=headers)
            return await self.client.send(request, stream=True)  # type: ignore[no-any-return]
        response = await session.post(
            self.url + path, data=body, headers=headers, proxy=self._proxy
        )
        return _AiohttpAnswer(response)

    def _aiohttp_session(self) -> Any:
        """aiohttp's session for this event loop (``None``: httpx serves this call —
        not on asyncio, or aiohttp not used)."""
        aiohttp = self._aiohttp
        if aiohttp is None:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # trio
            return None
        if self._loop is not loop:
            if self._ssl is None:  # the same certificates httpx trusts
                self._ssl = self._httpx.create_ssl_context()
            self._loop = loop
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None),  # the stack's timeouts bound it
                connector=aiohttp.TCPConnector(limit=MOST_CONNECTIONS, ssl=self._ssl),
                # no cookie kept from one tenant's answer to send with another's request
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            # the environment's proxy, read once (aiohttp's trust_env reads it, and
            # ~/.netrc, on a worker thread at every request)
            self._proxy = proxy_for(self.url)
        return self._session

    async def aclose(self) -> None:
        await self.client.aclose()
        session, self._session, self._loop = self._session, None, None
        if session is not None:
            await session.close()
