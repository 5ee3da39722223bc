"""One request, one value: everything the proxy decides about a request as it arrives,
built once and handed to every step that serves it.

``ProxyRequest`` holds the wire, the upstream the routes chose and the path there, the
parsed body and the bytes that came, who asked (``Caller``: tenant, team, key id), the
conversation, the model, whether it streams and what it is estimated to cost. The
guards, the budgets' reserve and settle, the upstream call, the relay of the answer
and the logs read it — none reads who asked from a context variable or reaches back
into the server object, so a decision made while a stream is relayed, long after the
route's handler returned, names its tenant, team, key and conversation like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from guardstack.gateway.model_proxy.conversations import Conversation
from guardstack.gateway.model_proxy.routes import SELECTORS
from guardstack.gateway.model_proxy.wires import Wire
from guardstack.gateway.request_log import Finished
from guardstack.pipeline import Usage
from guardstack.pipeline.decisions import decided

if TYPE_CHECKING:
    from guardstack.gateway.model_proxy.targets import Target
    from guardstack.gateway.tenants import KeyEntry

__all__ = ["Caller", "Estimate", "ProxyRequest"]


@attrs.frozen
class Caller:
    """Who asked: the key's tenant, team and id (``TENANT/NAME``, else its digest id);
    all ``None`` when the proxy has no tenants (any client, one tenant)."""

    tenant: str | None = None
    team: str | None = None
    key_id: str | None = None
    entry: KeyEntry | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def of(cls, entry: KeyEntry | None, tenant: str | None) -> Caller:
        if entry is None:
            return cls(tenant)
        return cls(entry.tenant, entry.team, entry.id, entry)

    def labels(self) -> dict[str, str]:
        """What the conversation's agent is labelled with (``loop.create(labels=…)``)."""
        found = {"team": self.team, "key_name": self.key_id}
        return {name: value for name, value in found.items() if value is not None}


@attrs.frozen
class Estimate:
    """What a request may cost before the upstream says: its input tokens (every input
    its wire carries) and its output tokens (the stated or observed limit, times the
    answers it asks for)."""

    input_tokens: int
    output_tokens: int


@attrs.frozen(eq=False)
class ProxyRequest:
    """One request through the proxy (see the module docstring)."""

    wire: Wire
    #: The upstream the routes chose, and the path there (Gemini's names the model).
    target: Target
    path: str
    data: dict[str, Any]
    body: bytes
    headers: Mapping[str, str]
    caller: Caller
    conversation: Conversation
    #: Whether the conversation was made for this request (met afresh).
    fresh: bool
    model: str
    stream: bool
    messages: list[Any]
    #: One digest per history item (what a resend is told apart by).
    history: list[str]
    estimate: Estimate
    #: When the proxy began it (``time.perf_counter``).
    started: float

    @property
    def structured(self) -> bool:
        """Whether the request asks for structured (JSON) output: its stop cannot be
        words (``exchange.stop_response``)."""
        return self.wire.asks_structured(self.data)

    @property
    def conversation_id(self) -> str:
        return self.conversation.agent.session_id

    def about(self) -> dict[str, str | None]:
        """Who and what a decision about this request names."""
        return {
            "tenant": self.caller.tenant or self.conversation.agent.tenant,
            "team": self.caller.team,
            "key_name": self.caller.key_id,
            "conversation": self.conversation_id,
            "model": self.model,
        }

    def finished(
        self,
        status: int,
        stopped: str | None,
        *,
        ms: float,
        overhead_ms: float,
        usage: Usage | None = None,
        usd: float | None = 0.0,
    ) -> Finished:
        """The request-log record of this request, answered with ``status``."""
        about = self.about()
        return Finished(
            about["tenant"], about["team"], about["key_name"], about["conversation"],
            self.model, SELECTORS[self.wire.name], self.target.name, self.stream, status,
            usage.input_tokens if usage is not None else None,
            usage.output_tokens if usage is not None else None,
            usd, ms, overhead_ms, stopped,
        )  # fmt: skip

    def decided(
        self, event: str, *, layer: str, decision: str, reason: str = "", signals: Any = None
    ) -> None:
        """One decision-log line about this request (a guard's decision also a guardrail
        event among the stack's ``signals``)."""
        decided(
            event, layer=layer, decision=decision, reason=reason, signals=signals, **self.about()
        )
