"""The proxy's conversations: one agent each, keyed by tenant and conversation, bounded.

A conversation is the ``x-guardstack-conversation`` header, else a digest of the
client's key, the system prompt and the first user message — always *within the
client's tenant*: one tenant can never reach, spend or reset another's conversation,
whatever header it sends. A conversation unused for ``idle_s`` is freed, and beyond
``most`` the least recently used go first; what its caps counted lives in the ledger
(a session's count for the session's lifetime), so freeing a conversation never
resets a cap. A conversation met again starts from the calls of its current turn (the
history before its last prompt was counted when it happened).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from guardstack.pipeline import Agent
from guardstack.pipeline.contract import store_key

__all__ = ["Conversation", "Conversations", "named"]


class Conversation:
    """One conversation's agent and what the guards have seen of it."""

    __slots__ = ("agent", "calls", "prompts", "used")

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.calls: set[str] = set()
        self.prompts = -1  # no prompt seen yet
        self.used = 0.0


def named(headers: Mapping[str, str], header: str, messages: list[Any]) -> str:
    """The conversation a request names, else one digested from what it starts with."""
    given = headers.get(header)
    if given:
        return given
    key = headers.get("authorization") or headers.get("x-api-key", "")
    system = next((m.get("content") for m in messages if m.get("role") == "system"), "")
    first = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    seed = json.dumps([key, system, first], sort_keys=True, default=str)
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


class Conversations:
    """Tenant and name -> ``Conversation``, freed when idle and beyond a bound."""

    def __init__(self, make: Callable[[str], Agent], *, idle_s: float, most: int) -> None:
        self.make = make
        self.idle_s = idle_s
        self.most = most
        self._open: OrderedDict[tuple[str, str], Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def get(self, tenant: str | None, name: str) -> tuple[Conversation, bool]:
        """The conversation, and whether it is new here (made now)."""
        now = anyio.current_time()
        self._free_idle(now)
        key = (tenant or "", name)
        found = self._open.get(key)
        fresh = found is None
        if found is None:
            # the session id carries the tenant: its ledger entries are the tenant's own.
            # The pair is escaped part by part, never joined as text: a tenant named
            # ``acme`` sending ``prod/support`` is not tenant ``acme/prod``'s ``support``
            session = name if tenant is None else store_key(tenant, name)
            found = self._open[key] = Conversation(self.make(session))
            while len(self._open) > self.most:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(key)
        found.used = now
        return found, fresh

    def _free_idle(self, now: float) -> None:
        while self._open:
            key, oldest = next(iter(self._open.items()))
            if now - oldest.used < self.idle_s:
                return
            del self._open[key]
