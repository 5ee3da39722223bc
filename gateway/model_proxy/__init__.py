"""``guardstack model-proxy``: guards for an agent you cannot change, at its base URL.

An HTTP server speaking three provider APIs — OpenAI's chat completions
(``POST /v1/chat/completions``), Anthropic's Messages (``POST /v1/messages``) and
OpenAI's Responses (``POST /v1/responses``), each in JSON and SSE, and
``GET /v1/models`` — in front of an upstream provider. It holds a provider key, so it is
held to what a gateway is held to (``integrations/_gate.py``): a known client key on
every route, no browser it does not know, bounded bodies and conversations, and bad
input answered in the API's own error shape, never a bare 500.

Every request goes through the assembled stack:

* **the whole model stage** (``AgentLoop.call_model``: every layer and hook) —
  ``Retry`` (honouring the upstream's Retry-After), timeouts, a breaker, rate and
  adaptive limits, ``UsageLimit`` and ``ModelCallLimit`` (which price and reserve at
  the request's own ``model`` and output limit), ``Tracing``'s ``chat`` span,
  ``BudgetNotice``: the upstream call is the model;
* **the conversation's guards** — the tool calls and results in the request's history
  are fed to the tool stages once each, as calls of the conversation's current turn (a
  new person's message starts a new turn): a reminder is appended to the forwarded
  request as the person's words; a denial or an end of turn — the calls already ran at
  the client, so the next reply is a stop — is answered as an assistant message naming
  the guard, with ``finish_reason: "stop"`` and an ``x-guardstack-stopped`` header.

Passthrough is exact: with nothing to add, the upstream gets the client's body byte
for byte, and the client the upstream's response — a stream chunk by chunk, as it
arrives; an upstream error keeps its status and body; an upstream answer whose usage
the proxy cannot account for passes through unchanged and is charged as unknown (its
reservation). Every stream is charged: the proxy asks for usage on every chat stream
(``stream_options.include_usage``) and strips that chunk when the client did not, and
a client that leaves mid-stream is charged what the upstream reported (the proxy reads
on for up to ``drain_ms``). The upstream key comes from the environment only, is never
logged, and a client's own key is never forwarded.
"""

from guardstack.gateway.model_proxy.app import CONVERSATION_HEADER, STOPPED_HEADER, ModelProxy
from guardstack.gateway.model_proxy.upstream import DEFAULT

__all__ = ["CONVERSATION_HEADER", "DEFAULT", "STOPPED_HEADER", "ModelProxy"]
