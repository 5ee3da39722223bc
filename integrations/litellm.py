"""A ``Model`` over any provider LiteLLM reaches, through ``litellm.acompletion``.

LiteLLM speaks the chat-completions format to a hundred providers (Anthropic,
Bedrock, Vertex, Gemini, Ollama, vLLM, Azure…); ``LiteLLMModel`` turns it into
guardstack's model seam::

    import os
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before importing litellm

    from guardstack.integrations.litellm import LiteLLMModel

    model = LiteLLMModel("anthropic/claude-sonnet-4-5", max_tokens=4096, num_retries=0)

* **Set ``LITELLM_LOCAL_MODEL_COST_MAP=True``** before LiteLLM is imported:
  otherwise importing it fetches its cost map from the network.
* **Turn LiteLLM's own retries off** (``num_retries=0``, and ``max_retries=0`` for
  the OpenAI-style clients it builds) when a model-stage ``Retry`` owns retries:
  otherwise LiteLLM retries inside one guardstack attempt, out of sight of your
  stack's timeouts, metrics and budgets.
* **Nothing printed**: creating a ``LiteLLMModel`` sets ``litellm.suppress_debug_info``,
  so a provider error is not announced on stdout with a "Give Feedback" banner (an
  agent's stdout may be its protocol); the error itself reaches your stack as a
  ``ModelError`` and LiteLLM's own logging is untouched.
* **asyncio only**: LiteLLM's async API runs on asyncio, not trio; on trio
  ``complete`` raises ``RuntimeError`` saying so.

What it does: sends ``session.messages()`` (with the thinking blocks under LiteLLM's
own name, ``thinking_blocks``, which it sends back to Anthropic unchanged) and the
tool schemas, plus every keyword you gave (``api_base=``, ``api_key=``,
``temperature=``…); returns text, tool calls, usage (cache reads and writes
included), reasoning, thinking blocks, the model and the finish reason; with
``stream=True`` reports text to ``on_delta`` and reassembles tool calls. LiteLLM's
exceptions map to the same codes as the other adapters: ``RateLimitError`` →
``MODEL_RATE_LIMITED`` (with the provider's ``retry-after``), an overloaded provider
(Anthropic's 529) → ``MODEL_OVERLOADED``, ``ServiceUnavailableError``,
``InternalServerError``, ``BadGatewayError`` and connection errors →
``MODEL_UNAVAILABLE``, ``Timeout`` → ``MODEL_TIMEOUT``,
``ContextWindowExceededError``, ``AuthenticationError`` and the other bad requests →
``MODEL_REJECTED``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from guardstack.integrations._extras import require
from guardstack.integrations._provider import (
    OnDelta,
    ProviderModel,
    answer,
    check_on_delta,
    error_message,
    report_delta,
    retry_after_s,
    status_error,
)
from guardstack.integrations.openai import StreamedReply, reply_from_choices
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_OVERLOADED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    ChunkListener,
    ModelError,
    ModelReply,
)
from guardstack.pipeline.validate import cut

__all__ = ["LiteLLMModel", "model_error"]

EXTRA = "litellm"


class LiteLLMModel(ProviderModel):
    """A guardstack ``Model`` over ``litellm.acompletion``."""

    def __init__(
        self,
        model: str,
        *,
        stream: bool = False,
        on_delta: OnDelta | None = None,
        **params: Any,
    ) -> None:
        self._litellm = require("litellm", EXTRA)
        self._openai = require("openai", EXTRA)
        self._litellm.suppress_debug_info = True  # type: ignore[attr-defined]
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a LiteLLM model name, got {cut(model)}")
        own = sorted({"messages", "tools", "model"}.intersection(params))
        if own:
            raise TypeError(f"LiteLLMModel sets {', '.join(own)} itself; do not pass them")
        check_on_delta(on_delta)
        self.model = model
        self.stream = bool(stream)
        self.on_delta = on_delta
        self.params = params
        provider = model.split("/", 1)[0] if "/" in model else "litellm"
        #: ``gen_ai.provider.name`` for telemetry: the provider prefix of the model name.
        self.provider = provider

    @property
    def max_tokens(self) -> int | None:
        """The request's output limit, which a spend cap reserves for each call."""
        for name in ("max_completion_tokens", "max_tokens"):
            value = self.params.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    def __repr__(self) -> str:
        return f"LiteLLMModel({self.model!r}, stream={self.stream})"

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_chunk: ChunkListener | None = None,
    ) -> ModelReply:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "LiteLLMModel runs on asyncio only (LiteLLM's async API does not run under "
                "trio); run this agent with anyio.run(..., backend='asyncio')"
            ) from None
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [_without_error_flag(message) for message in messages],
            **self.params,
        }
        if tools:
            params["tools"] = tools
        if self.stream:
            return await answer(
                lambda: self._streamed(params, on_chunk), self._openai.OpenAIError, model_error
            )
        return await answer(lambda: self._once(params), self._openai.OpenAIError, model_error)

    async def _once(self, params: dict[str, Any]) -> ModelReply:
        return _reply(await self._litellm.acompletion(**params), self._litellm)

    async def _streamed(
        self, params: dict[str, Any], on_chunk: ChunkListener | None = None
    ) -> ModelReply:
        params.setdefault("stream_options", {"include_usage": True})
        stream = await self._litellm.acompletion(**params, stream=True)
        parts = StreamedReply()
        async for chunk in stream:
            text = parts.add(chunk)
            if on_chunk is not None:
                on_chunk(text or "")
            await report_delta(self.on_delta, text)
        return parts.reply()


def _reply(response: Any, litellm: Any) -> ModelReply:
    if not isinstance(response, litellm.ModelResponse):
        raise ModelError(f"LiteLLM's reply is not a chat completion: {cut(response)}", MODEL_FAILED)
    return reply_from_choices(response)


def _without_error_flag(message: dict[str, Any]) -> dict[str, Any]:
    """The tool message without guardstack's ``is_error`` (LiteLLM sends it on as given)."""
    if "is_error" not in message:
        return message
    return {key: value for key, value in message.items() if key != "is_error"}


def model_error(error: BaseException) -> ModelError:
    """The ``ModelError`` a LiteLLM exception means (see the module docstring)."""
    litellm = require("litellm", EXTRA)
    message = error_message(error)
    if isinstance(error, litellm.Timeout):
        return ModelError(f"the provider did not answer in time: {message}", MODEL_TIMEOUT)
    if isinstance(error, litellm.ContextWindowExceededError):
        return ModelError(
            f"the request is longer than the context window: {message}", MODEL_REJECTED
        )
    if isinstance(error, litellm.APIConnectionError):
        return ModelError(f"cannot reach the provider: {message}", MODEL_UNAVAILABLE)
    headers = _headers(error)
    upstream = getattr(error, "provider_status_code", None)
    if upstream == 529 or (
        isinstance(error, litellm.InternalServerError) and "overloaded" in message.lower()
    ):
        return ModelError(
            f"the provider is overloaded: {message}", MODEL_OVERLOADED, retry_after_s(headers)
        )
    status = getattr(error, "status_code", None)
    if isinstance(error, litellm.InternalServerError) and not _upstream_answered(error):
        # LiteLLM's own 500 for a reply it could not read: the provider answered (200),
        # so sending the request again buys the same reply
        return ModelError(
            f"the provider's reply could not be read (by LiteLLM): {cut(message, 300)}",
            MODEL_FAILED,
        )
    if isinstance(status, int) and not isinstance(status, bool):
        return status_error(status, message, headers)
    return ModelError(f"{type(error).__name__}: {message}", MODEL_FAILED)


def _upstream_answered(error: BaseException) -> bool:
    """Whether a LiteLLM status error carries the provider's own error status: an HTTP
    status error in its chain, or a response with the provider's headers (LiteLLM's own
    500s for replies it could not parse carry a made-up response without any)."""
    seen: BaseException | None = error
    for _ in range(16):
        if seen is None:
            return False
        headers = getattr(getattr(seen, "response", None), "headers", None)
        if type(seen).__name__ == "HTTPStatusError" or (isinstance(headers, Mapping) and headers):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _headers(error: BaseException) -> Mapping[str, str] | None:
    """The provider's response headers: LiteLLM keeps them on the error's response (and
    its own ``litellm_response_headers``)."""
    for source in (
        getattr(error, "litellm_response_headers", None),
        getattr(error, "headers", None),
    ):
        if isinstance(source, Mapping) and source:
            return source
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    return headers if isinstance(headers, Mapping) else None
