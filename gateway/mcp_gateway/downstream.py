"""One downstream MCP server, kept running: started, watched, restarted with backoff.

A ``Downstream`` connects to its server (a child over stdio, or a streamable-HTTP URL),
lists what it offers — tools (every page), prompts, resources, resource templates — and
registers its tools in the gateway's harness under ``<server>_<tool>``. Then it watches
the connection: a ping every ``ping_s``, every call's answer, and the server's own
list-changed notifications (it lists again, and the gateway's clients are told). When
the server goes away:

* every call waiting on it is answered ``TOOL_UNAVAILABLE`` at once (the SDK fails the
  requests of a closed connection), and a call that comes later gets the same answer
  without waiting, naming when the next start is;
* its tools stay registered, answering ``TOOL_UNAVAILABLE`` (a client that listed them
  is told the server is restarting, never that the tool does not exist);
* it is started again after a backoff (0.5 s, doubling, at most 30 s), and once it
  answers, its tools come back as it lists them now.

The other downstreams are not touched: each runs in its own task.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Literal, TextIO

import anyio
import attrs

from guardstack.gateway.mcp_gateway.config import ServerSpec, served_names
from guardstack.integrations.mcp import mcp_tools, metering_provider, tracing_provider
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.onion import Registration
from guardstack.pipeline.values import TOOL_UNAVAILABLE, ToolCall, ToolDefinition, ToolResult

__all__ = ["RESTARTING", "Downstream"]

logger = logging.getLogger("guardstack")

FIRST_BACKOFF_S: Final = 0.5
MAX_BACKOFF_S: Final = 30.0
PING_S: Final = 5.0
#: How long a start (connecting, and listing what it offers) may take.
START_TIMEOUT_S: Final = 30.0
#: The error name of a call to a server that is down (the call never reached it).
RESTARTING: Final = "McpServerRestarting"

Status = Literal["not started", "starting", "up", "down"]
#: Told what changed: a list-changed notification for the gateway's clients.
OnChange = Callable[[Any], Awaitable[None]]


class Downstream:
    """A supervised downstream server (see the module docstring)."""

    def __init__(
        self,
        spec: ServerSpec,
        harness: Harness,
        *,
        on_change: OnChange | None = None,
        ping_s: float = PING_S,
        first_backoff_s: float = FIRST_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        errlog: TextIO | None = None,
    ) -> None:
        self.spec = spec
        self.harness = harness
        self.on_change = on_change
        self.ping_s = ping_s
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.errlog = errlog if errlog is not None else sys.stderr
        self.status: Status = "not started"
        self.session: Any = None
        #: What it offers: tools (its own name -> the MCP Tool), prompts, resources,
        #: resource templates.
        self.tools: dict[str, Any] = {}
        self.prompts: list[Any] = []
        self.resources: list[Any] = []
        self.templates: list[Any] = []
        self.starts = 0
        #: When (anyio time) the next start is, while down.
        self.back_at = 0.0
        #: Why it last went away.
        self.last_error: str | None = None
        self._registered: dict[str, Registration] = {}
        #: Its own names -> the names served, and back (letters, digits, _ and - only).
        self._served: dict[str, str] = {}
        self._own: dict[str, str] = {}
        #: Set to wake the watch: the connection was found closed, or a list changed.
        self._wake = anyio.Event()
        self._lost = self._relist = False
        self._tried = anyio.Event()

    @property
    def name(self) -> str:
        return self.spec.name

    def served(self, name: str) -> str:
        """The name the gateway serves its ``name`` under (``config.served_names``)."""
        found = self._served.get(name)
        return found if found is not None else served_names(self.spec.name, [name])[name]

    def own(self, served: str) -> str | None:
        """Its own name for a name the gateway serves, or ``None``."""
        return self._own.get(served)

    def _name_all(self, names: list[str]) -> None:
        self._served = served_names(self.spec.name, sorted(set(names)))
        self._own = {served: name for name, served in self._served.items()}

    async def wait_tried(self) -> None:
        """Until its first start has succeeded or failed."""
        await self._tried.wait()

    def offers(self, uri: str) -> bool:
        """Whether ``uri`` is one of its resources, or fits one of its templates."""
        return any(str(r.uri) == uri for r in self.resources) or any(
            uri.startswith(str(t.uri_template).split("{", 1)[0]) for t in self.templates
        )

    async def run(self) -> None:
        """Start it, and start it again each time it goes away, until cancelled."""
        backoff = self.first_backoff_s
        while True:
            self.status = "starting"
            self.starts += 1
            try:
                async with self._connected() as session:
                    with anyio.fail_after(START_TIMEOUT_S):
                        await self._learn(session)
                    self.session, self.status, self.last_error = session, "up", None
                    backoff = self.first_backoff_s
                    self._tried.set()
                    await self._changed()
                    await self._watch(session)
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as error:  # a dying child says many things
                if isinstance(error, KeyboardInterrupt | SystemExit):
                    raise
                self.last_error = _reason(error)
                logger.warning("mcp gateway: server %r is down (%s)", self.name, self.last_error)
            self._tried.set()
            self.session, self.status = None, "down"
            self.back_at = anyio.current_time() + backoff
            await self._mark_down()
            await anyio.sleep(backoff)
            backoff = min(self.max_backoff_s, backoff * 2)

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[Any]:
        from mcp import ClientSession, StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        spec = self.spec
        if spec.url is not None:
            import httpx2  # the MCP SDK's own HTTP client

            client = httpx2.AsyncClient(headers=dict(spec.headers or {}), timeout=None)
            async with (
                client,
                streamable_http_client(spec.url, http_client=client) as streams,
                ClientSession(streams[0], streams[1], message_handler=self._heard) as session,
            ):
                await session.initialize()
                yield session
            return
        params = StdioServerParameters(
            command=spec.command[0], args=list(spec.command[1:]), env=dict(spec.env or {}) or None
        )
        async with (
            stdio_client(params, errlog=self.errlog) as (read, write),
            ClientSession(read, write, message_handler=self._heard) as session,
        ):
            await session.initialize()
            yield session

    async def _heard(self, message: Any) -> None:
        """What the server says on its own: a list changed (list again), or a fault."""
        from mcp import types

        changed = (
            types.ToolListChangedNotification,
            types.PromptListChangedNotification,
            types.ResourceListChangedNotification,
        )
        if isinstance(message, changed):
            self._relist = True
            self._wake.set()
        elif isinstance(message, Exception):
            logger.debug("mcp gateway: server %r: %s", self.name, _reason(message))

    async def _learn(self, session: Any) -> None:
        """What it offers now; its tools registered under the gateway's names."""
        definitions = await mcp_tools(
            session,
            timeouts_ms=self.spec.timeouts_ms,
            tracer_provider=tracing_provider(self.harness),
            meter_provider=metering_provider(self.harness),
        )
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        offered = session.server_capabilities
        self.prompts = (await session.list_prompts()).prompts if offered and offered.prompts else []
        if offered and offered.resources:
            self.resources = (await session.list_resources()).resources
            self.templates = (await session.list_resource_templates()).resource_templates
        else:
            self.resources, self.templates = [], []
        self.tools = {name: tool for name, tool in listed.items() if name in _names(definitions)}
        self._name_all(
            [*self.tools, *(p.name for p in self.prompts), *(r.name for r in self.resources)]
            + [t.name for t in self.templates]
        )
        self._register([(d, self._live(d)) for d in definitions])

    def _live(self, definition: ToolDefinition) -> Callable[..., Awaitable[Any]]:
        execute: Callable[..., Awaitable[Any]] = definition.execute  # type: ignore[assignment]
        served = self.served(definition.name)

        async def call(arguments: Any, tool_call: ToolCall) -> Any:
            result = await execute(arguments, tool_call)
            if isinstance(result, ToolResult) and result.code == TOOL_UNAVAILABLE:
                self._lost = True  # its connection closed under the call: restart now
                self._wake.set()
                return ToolResult.failure(
                    f"the MCP server {self.name!r} behind tool {served!r} stopped (its "
                    "connection closed); the call did not complete, and the server is being "
                    "started again",
                    name=result.error.name if result.error is not None else None,
                    code=TOOL_UNAVAILABLE,
                )
            return result

        return call

    def _register(self, tools: list[tuple[ToolDefinition, Callable[..., Awaitable[Any]]]]) -> None:
        for registration in self._registered.values():
            registration.dispose()
        self._registered = {}
        for definition, execute in tools:
            served = attrs.evolve(definition, name=self.served(definition.name), execute=execute)
            self._registered[definition.name] = self.harness.tools.register(served)

    async def _mark_down(self) -> None:
        """Its tools answer ``TOOL_UNAVAILABLE`` now, naming when it starts again."""
        tools = []
        for name in list(self._registered):
            current = self.harness.tools.get(self.served(name))
            if current is not None:
                tools.append((attrs.evolve(current, name=name), self._unavailable(name)))
        self._register(tools)
        await self._changed()

    def _unavailable(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def unavailable(arguments: Any, call: ToolCall) -> ToolResult:
            wait = max(0.0, self.back_at - anyio.current_time())
            return ToolResult.failure(
                f"the MCP server {self.name!r} behind tool {self.served(name)!r} is not "
                f"answering; it is being started again (next try in {math.ceil(wait)}s)",
                name=RESTARTING,
                code=TOOL_UNAVAILABLE,
            )

        return unavailable

    async def _watch(self, session: Any) -> None:
        """Until the connection is gone: a ping every ``ping_s``; a call that found it
        closed; a list change (list again)."""
        self._lost = self._relist = False
        while True:
            self._wake = anyio.Event()
            with anyio.move_on_after(self.ping_s):
                await self._wake.wait()
            if self._lost:
                return
            if self._relist:
                self._relist = False
                with anyio.fail_after(START_TIMEOUT_S):
                    await self._learn(session)
                await self._changed()
                continue
            with anyio.fail_after(max(1.0, self.ping_s)):
                await session.send_ping()

    async def _changed(self) -> None:
        if self.on_change is None:
            return
        from mcp import types

        try:
            await self.on_change(types.ToolListChangedNotification())
        except Exception:  # telling clients is best effort
            logger.debug("mcp gateway: could not tell the clients", exc_info=True)

    def describe(self) -> str:
        where = self.spec.url or " ".join(self.spec.command)
        state = self.status if self.last_error is None else f"{self.status}: {self.last_error}"
        return f"{self.name} ({state}; {len(self.tools)} tools): {where}"


def _names(definitions: list[ToolDefinition]) -> set[str]:
    return {definition.name for definition in definitions}


def _reason(error: BaseException) -> str:
    """One line for what ended a connection (an exception group's first real error)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"[:300]
