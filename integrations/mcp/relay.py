"""What a downstream MCP server says on its own, relayed to the proxy's clients."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("guardstack")

__all__ = [
    "NotificationRelay",
]


class NotificationRelay:
    """What the downstream server says on its own, relayed to the proxy's clients: pass
    it as the downstream ``ClientSession``'s ``message_handler``.

    * a tool list change first brings the harness's tools up to date
      (``on_tools_changed``), then is relayed;
    * list changes and resource updates go to every client: on a 2026-07-28
      connection through its ``subscriptions/listen`` streams, on an older one as
      the notification itself;
    * a log message goes to the clients with a call in flight, on that call's
      stream (the downstream is one session for all clients, so a log cannot be
      told apart further), else to every older connection.
    """

    def __init__(self) -> None:
        from mcp.server.subscriptions import InMemorySubscriptionBus

        self.bus = InMemorySubscriptionBus()
        self.connections: weakref.WeakSet[Any] = weakref.WeakSet()
        #: The calls in flight: where a log message goes.
        self.calls: dict[int, tuple[Any, Any]] = {}
        self.on_tools_changed: Callable[[], Awaitable[None]] | None = None

    async def __call__(self, message: Any) -> None:
        if isinstance(message, Exception):
            return
        try:
            await self._relay(message)
        except Exception:  # a client that left, a refresh that failed: the proxy goes on
            logger.warning("mcp-proxy: a downstream notification was not relayed", exc_info=True)

    async def _relay(self, message: Any) -> None:
        from mcp import types
        from mcp.server.subscriptions import (
            PromptsListChanged,
            ResourcesListChanged,
            ResourceUpdated,
            ToolsListChanged,
        )

        event: Any
        legacy: tuple[str, tuple[str, ...]]
        if isinstance(message, types.LoggingMessageNotification):
            await self._log(message.params)
            return
        if isinstance(message, types.ToolListChangedNotification):
            if self.on_tools_changed is not None:
                await self.on_tools_changed()
            event, legacy = ToolsListChanged(), ("send_tool_list_changed", ())
        elif isinstance(message, types.PromptListChangedNotification):
            event, legacy = PromptsListChanged(), ("send_prompt_list_changed", ())
        elif isinstance(message, types.ResourceListChangedNotification):
            event, legacy = ResourcesListChanged(), ("send_resource_list_changed", ())
        elif isinstance(message, types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            event, legacy = ResourceUpdated(uri), ("send_resource_updated", (uri,))
        else:
            return
        await self.bus.publish(event)
        for connection in self._older():
            await getattr(connection, legacy[0])(*legacy[1])

    async def _log(self, params: Any) -> None:
        import warnings

        if self.calls:
            for session, request_id in list(self.calls.values()):
                await session.send_log_message(
                    params.level, params.data, params.logger, related_request_id=request_id
                )
            return
        for connection in self._older():
            with warnings.catch_warnings():  # connection-wide logs: only before 2026-07-28
                warnings.simplefilter("ignore")
                await connection.log(params.level, params.data, params.logger)

    def _older(self) -> list[Any]:
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        return [
            connection
            for connection in list(self.connections)
            if getattr(connection, "protocol_version", None) not in MODERN_PROTOCOL_VERSIONS
        ]
