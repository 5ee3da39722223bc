"""The proxy's conversations: one agent session each, found by who the client says it is
and by the history it sends, bounded.

**Which session a request belongs to.** Its identity is, in order: the
``x-guardstack-conversation`` header; the client's own session id (Claude Code's
``x-claude-code-session-id``; Codex's ``session-id`` header, else the Responses body's
``prompt_cache_key``); else a digest of the client's key, the system prompt or
instructions (every API: Messages' ``system``, Responses' ``instructions``, the
``system`` and ``developer`` messages, Gemini's ``systemInstruction``) and the first
user message. Always *within the client's tenant*: one tenant can never reach, spend or
reset another's conversation, whatever header it sends — the pair is kept as separate
escaped parts, never joined as text.

**History decides the rest.** An identity holds threads; a request continues the
thread whose history (as the client sent it last, cache markers ignored) is a prefix of
its own — or, for a client that reorders earlier messages, whose every item it holds
again, and more — and otherwise starts a new thread with counts of its own: two runs of one
prompt, one after the other or at once, never share per-turn or per-conversation
counts or loop evidence, and a client's side requests (a title, a summary) do not
mix with its main loop. A request whose history is the thread's exactly is a resend of
it only while that one failed (or when the client says it retries:
``x-stainless-retry-count``); sent while the first is still in flight or after it was
answered, it is another run that begins alike. The first thread of an identity is
named by the identity alone, so every process of a shared store counts it alike; later
ones carry a token of their own (set ``x-guardstack-conversation`` for one name across
processes).

A conversation unused for ``idle_s`` is freed, and beyond ``most`` the least recently
used go first; what its caps counted lives in the ledger, so freeing a conversation
never resets a cap. A conversation met again starts from the calls of its current turn
(the history before its last prompt was counted when it happened).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

import anyio

from guardstack.pipeline import Agent
from guardstack.pipeline.contract import new_token, store_key

__all__ = ["Conversation", "Conversations", "digests", "family", "identity"]

#: The headers a client's own session id arrives in, by client.
SESSION_HEADERS: Final = ("x-claude-code-session-id", "session-id")
#: How many threads one identity keeps (the most recently used).
MAX_THREADS: Final = 16


class Conversation:
    """One conversation's agent and what the guards have seen of it."""

    __slots__ = (
        "agent", "calls", "decided", "failed", "history", "key", "prompts", "resends",
        "state", "succeeded", "used", "wrapped",
    )  # fmt: skip

    def __init__(self, agent: Agent, key: tuple[str, str]) -> None:
        self.agent = agent
        self.key = key
        #: Tool calls whose results went through the guards (by id).
        self.calls: set[str] = set()
        #: Tool calls decided on the answer that asked for them: their results are
        #: reviewed (post-execute), not counted again.
        self.decided: set[str] = set()
        self.prompts = -1  # no prompt seen yet
        self.used = 0.0
        #: Digests of the history the client sent last.
        self.history: list[str] = []
        #: The last request's state: ``asking`` (in flight), ``answered`` or ``failed``.
        self.state = "asking"
        #: This turn: whether an upstream call worked, and the last failure if none did.
        self.succeeded = False
        self.failed: Any = None
        #: Whether a budget's wrap-up answer was its last: past it, a budget refuses.
        self.wrapped = False
        #: Operations that failed, by body digest: a resend's attempts count on.
        self.resends: OrderedDict[str, Any] = OrderedDict()

    def asked(self, ids: set[str]) -> bool:
        """Whether one of these tool calls was asked for in this conversation."""
        return bool(ids) and not (self.decided.isdisjoint(ids) and self.calls.isdisjoint(ids))


def _without_markers(value: Any) -> Any:
    """A value with every ``cache_control`` marker left out (clients move them)."""
    if isinstance(value, dict):
        return {k: _without_markers(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_markers(item) for item in value]
    return value


def digests(messages: list[Any]) -> list[str]:
    """One digest per history item, cache markers ignored."""
    found = []
    for message in messages:
        text = json.dumps(_without_markers(message), sort_keys=True, default=str)
        found.append(hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24])
    return found


def identity(
    headers: Mapping[str, str], header: str, system: str, first: str, data: Mapping[str, Any]
) -> str:
    """The identity a request names (see the module docstring)."""
    given = headers.get(header)
    if given:
        return f"named:{given}"
    for name in SESSION_HEADERS:
        session = headers.get(name)
        if session:
            return f"session:{session}"
    cache_key = data.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return f"session:{cache_key}"
    key = (
        headers.get("authorization")
        or headers.get("x-api-key")
        or headers.get("x-goog-api-key", "")
    )
    seed = json.dumps([key, system, first], sort_keys=True, default=str)
    return "digest:" + hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _reordered(threads: list[Conversation], history: list[str]) -> Conversation | None:
    """The thread whose history ``history`` holds every item of — each as often, in any
    order — and more: a client that moves earlier messages behind later ones on every
    request (one real agent does) continues its conversation. The longest such."""
    have = Counter(history)
    found: Conversation | None = None
    for thread in threads:
        size = len(thread.history)
        if not 0 < size < len(history) or (found is not None and size <= len(found.history)):
            continue
        if not Counter(thread.history) - have:  # nothing of it is missing
            found = thread
    return found


def family(headers: Mapping[str, str], header: str, system: str) -> str | None:
    """The identities a digest identity may share a conversation with (the same client
    key and system prompt, any first message): where a reordering client's next request
    is looked for. ``None`` when the client names its conversation or session."""
    if headers.get(header) or any(headers.get(name) for name in SESSION_HEADERS):
        return None
    key = (
        headers.get("authorization")
        or headers.get("x-api-key")
        or headers.get("x-goog-api-key", "")
    )
    seed = json.dumps([key, system], sort_keys=True, default=str)
    return hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class Conversations:
    """(Tenant, identity) -> threads of ``Conversation``, freed when idle and past a bound."""

    def __init__(
        self,
        make: Callable[[str, str | None, Mapping[str, str]], Agent],
        *,
        idle_s: float,
        most: int,
    ) -> None:
        self.make = make
        self.idle_s = idle_s
        self.most = most
        self._open: OrderedDict[tuple[str, str], list[Conversation]] = OrderedDict()
        self._count = 0
        #: (Tenant, family) -> the identities seen in it, most recent last (bounded).
        self._family: dict[tuple[str, str], OrderedDict[tuple[str, str], None]] = {}

    def __len__(self) -> int:
        return self._count

    def get(
        self,
        tenant: str | None,
        name: str,
        history: list[str],
        *,
        resend: bool = False,
        call_ids: Collection[str] = (),
        labels: Mapping[str, str] | None = None,
        related: str | None = None,
    ) -> tuple[Conversation, bool]:
        """The thread of ``(tenant, name)`` that ``history`` continues, or a new one;
        and whether it is new here (made now). ``resend``: the client says it retries;
        ``call_ids``: the tool calls in its history — of two threads that began alike,
        the one whose answer asked for them is the one it continues. ``labels`` name a
        new conversation's agent (the key that began it: its team and key id);
        ``related`` (``family``) names the identities a reordered history may continue a
        conversation of."""
        now = anyio.current_time()
        self._free_idle(now)
        key = (tenant or "", name)
        threads = self._open.get(key)
        if threads is None:
            threads = self._open[key] = []
        else:
            self._open.move_to_end(key)
        found = None
        ids = set(call_ids)
        have: Counter[str] | None = None  # counted only when a reordering is looked for
        for thread in threads:  # the longest history this one continues
            size = len(thread.history)
            continues = size <= len(history) and history[:size] == thread.history
            if continues and size == len(history) and not resend and thread.state != "failed":
                continues = False  # the same history again, not a retry: another run
            elif (
                not continues
                and 0 < size < len(history)
                and (found is None or size >= len(found.history))
            ):  # a client that reorders what it sent before: the same items, and more
                have = have if have is not None else Counter(history)
                continues = not Counter(thread.history) - have
            if continues and (
                found is None
                or size > len(found.history)
                or (size == len(found.history) and not found.asked(ids) and thread.asked(ids))
            ):
                found = thread
        if found is None and related is not None:
            kin = [
                thread
                for other in self._family.get((tenant or "", related), ())
                if other != key
                for thread in self._open.get(other, ())
            ]
            found = _reordered(kin, history)
            if found is not None:  # its identity is the one it began under
                key = found.key
                threads = self._open[key]
        if related is not None:
            members = self._family.pop((tenant or "", related), None) or OrderedDict()
            self._family[(tenant or "", related)] = members  # the most recent last
            while len(self._family) > self.most:
                del self._family[next(iter(self._family))]
            members[key] = None
            members.move_to_end(key)
            while len(members) > MAX_THREADS:
                members.popitem(last=False)
        fresh = found is None
        if found is None:
            # the first thread is named by the identity alone; later ones get a token.
            # The session id carries the tenant: its ledger entries are the tenant's own,
            # the parts escaped one by one, never joined as text
            parts = [name] if not threads else [name, new_token()]
            session = store_key(*parts) if tenant is None else store_key(tenant, *parts)
            found = Conversation(self.make(session, tenant, labels or {}), key)
            threads.insert(0, found)
            self._count += 1
            if len(threads) > MAX_THREADS:
                threads.pop()
                self._count -= 1
            while self._count > self.most and self._open:
                _, oldest = self._open.popitem(last=False)
                self._count -= len(oldest)
        else:
            threads.remove(found)
            threads.insert(0, found)
        found.history = history
        found.used = now
        found.state = "asking"
        return found, fresh

    def _free_idle(self, now: float) -> None:
        while self._open:
            key, threads = next(iter(self._open.items()))
            if threads and now - max(t.used for t in threads) < self.idle_s:
                return
            del self._open[key]
            self._count -= len(threads)
