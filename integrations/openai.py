"""A ``Model`` over any OpenAI-compatible chat-completions API, through the official client.

OpenAI, DeepSeek, vLLM, Ollama, llama.cpp's server and friends speak the same wire
protocol; ``OpenAIChatModel`` turns it into guardstack's model seam::

    from openai import AsyncOpenAI
    from guardstack.integrations.openai import OpenAIChatModel

    client = AsyncOpenAI(base_url="https://api.deepseek.com", api_key=key, max_retries=0)
    model = OpenAIChatModel(client, "deepseek-chat")

Build the client with ``max_retries=0`` when a model-stage ``Retry`` owns retries:
otherwise the client retries inside one guardstack attempt, out of sight of your
stack's timeouts, metrics and budgets.

What it does:

* sends ``session.messages()`` and the tool schemas as they are (an empty tool list
  is left out; the keys meant for Anthropic, ``thinking_blocks`` and ``is_error``,
  are dropped), plus any ``request_params`` (``temperature=…``, ``extra_body=…``);
* maps failures to ``ModelError`` codes: 429 → ``MODEL_RATE_LIMITED`` with
  ``retry_after_s`` from the response's ``retry-after-ms`` / ``retry-after``
  headers; 5xx, 409 and connection errors → ``MODEL_UNAVAILABLE``; the client's
  own timeout and 408 → ``MODEL_TIMEOUT``; other 4xx → ``MODEL_REJECTED``; a reply
  it cannot use (no choices, not a chat completion) → ``MODEL_FAILED``;
* returns usage (cached and reasoning tokens included), the model that answered,
  the finish reason, and the reasoning text (``reasoning_content``, DeepSeek's and
  vLLM's field), which the session log keeps and sends back on later requests;
* tool-call arguments stay the model's raw text: malformed JSON is answered with
  ``INVALID_ARGUMENTS`` by the registry, as for any model;
* with ``stream=True`` reads server-sent events, reports each piece of text to
  ``on_delta(text)`` (a plain or async callable) as it arrives, and reassembles
  streamed tool calls (requesting usage with ``stream_options`` unless you set it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from guardstack.integrations._extras import require
from guardstack.integrations._provider import (
    OnDelta,
    ProviderModel,
    answer,
    check_on_delta,
    error_message,
    report_delta,
    status_error,
    usage_reported,
)
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    ChunkListener,
    ModelError,
    ModelReply,
    ToolCallRequest,
    Usage,
)
from guardstack.pipeline.validate import cut

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = [
    "OpenAIChatModel",
    "StreamedReply",
    "chat_messages",
    "model_error",
    "reply_from_choices",
]

EXTRA = "openai"


class OpenAIChatModel(ProviderModel):
    """A guardstack ``Model`` over ``client.chat.completions.create``."""

    #: ``gen_ai.provider.name`` for telemetry.
    provider = "openai"

    def __init__(
        self,
        client: AsyncOpenAI,
        model: str,
        *,
        stream: bool = False,
        on_delta: OnDelta | None = None,
        **request_params: Any,
    ) -> None:
        self._openai = require("openai", EXTRA)
        completions = getattr(getattr(client, "chat", None), "completions", None)
        if not callable(getattr(completions, "create", None)):
            raise TypeError(
                f"client must be an openai.AsyncOpenAI (or compatible), got {cut(client)}"
            )
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a model name, got {cut(model)}")
        check_on_delta(on_delta)
        self.client = client
        self.model = model
        self.stream = bool(stream)
        self.on_delta = on_delta
        self.request_params = request_params

    @property
    def max_tokens(self) -> int | None:
        """The request's output limit (``max_completion_tokens`` or ``max_tokens``), which
        a spend cap reserves for each call; ``None`` when none is given."""
        return _output_limit(self.request_params)

    def __repr__(self) -> str:
        return f"OpenAIChatModel({self.model!r}, stream={self.stream})"

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_chunk: ChunkListener | None = None,
    ) -> ModelReply:
        params: dict[str, Any] = {
            "model": self.model,
            "messages": chat_messages(messages),
            **self.request_params,
        }
        if tools:
            params["tools"] = tools
        if self.stream:
            return await answer(
                lambda: self._streamed(params, on_chunk), self._openai.OpenAIError, model_error
            )
        return await answer(lambda: self._once(params), self._openai.OpenAIError, model_error)

    async def _once(self, params: dict[str, Any]) -> ModelReply:
        response = await self.client.chat.completions.create(**params)
        return _reply_from_completion(response, self._openai)

    async def _streamed(
        self, params: dict[str, Any], on_chunk: ChunkListener | None = None
    ) -> ModelReply:
        params.setdefault("stream_options", {"include_usage": True})
        stream = await self.client.chat.completions.create(**params, stream=True)
        parts = StreamedReply()
        try:
            async for chunk in stream:
                text = parts.add(chunk)
                if on_chunk is not None:
                    on_chunk(text or "")
                await report_delta(self.on_delta, text)
        finally:
            await stream.close()
        return parts.reply()


#: Keys ``session.messages()`` adds for other providers (Anthropic's thinking blocks and
#: ``tool_result`` error flag), which chat-completions APIs refuse as unknown.
FOREIGN_KEYS = frozenset({"thinking_blocks", "is_error"})


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` without the keys chat-completions APIs do not know (copied only where
    a message has one)."""
    return [
        {key: value for key, value in message.items() if key not in FOREIGN_KEYS}
        if FOREIGN_KEYS.intersection(message)
        else message
        for message in messages
    ]


def model_error(error: BaseException) -> ModelError:
    """The ``ModelError`` an ``openai`` exception means (see the module docstring)."""
    openai = require("openai", EXTRA)
    message = error_message(error)
    if isinstance(error, openai.APITimeoutError):
        return ModelError(f"the provider did not answer in time: {message}", MODEL_TIMEOUT)
    if isinstance(error, openai.APIConnectionError):
        return ModelError(f"cannot reach the provider: {message}", MODEL_UNAVAILABLE)
    if isinstance(error, openai.APIStatusError):
        return status_error(error.status_code, message, error.response.headers)
    return ModelError(f"{type(error).__name__}: {message}", MODEL_FAILED)


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    completion_details = getattr(usage, "completion_tokens_details", None)
    cached = getattr(prompt_details, "cached_tokens", None)
    if cached is None:  # DeepSeek reports its context cache this way
        cached = getattr(usage, "prompt_cache_hit_tokens", None)
    return usage_reported(
        getattr(usage, "prompt_tokens", None),
        getattr(usage, "completion_tokens", None),
        cached_input_tokens=cached,
        reasoning_tokens=getattr(completion_details, "reasoning_tokens", None),
        # LiteLLM reports Anthropic's cache writes this way
        cache_write_tokens=getattr(usage, "cache_creation_input_tokens", None),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _reply_from_completion(response: Any, openai: Any) -> ModelReply:
    if not isinstance(response, openai.types.chat.ChatCompletion):
        raise ModelError(
            f"the provider's reply is not a chat completion: {cut(response)}", MODEL_FAILED
        )
    return reply_from_choices(response)


def _thinking_blocks(value: object) -> tuple[dict[str, Any], ...]:
    """LiteLLM's ``thinking_blocks`` (Anthropic's signed thinking), when it gives them."""
    if not isinstance(value, list | tuple):
        return ()
    return tuple(dict(block) for block in value if isinstance(block, Mapping))


def reply_from_choices(response: Any) -> ModelReply:
    """The ``ModelReply`` of a chat completion (OpenAI's, or LiteLLM's of the same shape)."""
    if not response.choices:
        raise ModelError("the provider's reply has no choices", MODEL_FAILED)
    choice = response.choices[0]
    message = choice.message
    if message.content is not None and not isinstance(message.content, str):
        raise ModelError(
            f"the provider's reply content is {type(message.content).__name__}, not text",
            MODEL_FAILED,
        )
    calls = []
    for call in message.tool_calls or ():
        function = getattr(call, "function", None)
        if function is None:  # a custom (non-function) tool call: nothing we offered
            raise ModelError(
                f"the provider asked for a {getattr(call, 'type', '?')!r} tool call; "
                "only function tools are offered",
                MODEL_FAILED,
            )
        calls.append(ToolCallRequest(function.name, function.arguments or "", call.id or ""))
    return ModelReply(
        text=message.content or "",
        tool_calls=tuple(calls),
        usage=_usage(response.usage),
        reasoning=_text(getattr(message, "reasoning_content", None)),
        model=_text(response.model),
        finish_reason=_text(choice.finish_reason),
        thinking_blocks=_thinking_blocks(getattr(message, "thinking_blocks", None)),
    )


@attrs.define
class _StreamedCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = attrs.Factory(list)


@attrs.define
class StreamedReply:
    """A chat completion put back together from its streamed chunks."""

    text: list[str] = attrs.Factory(list)
    reasoning: list[str] = attrs.Factory(list)
    calls: dict[int, _StreamedCall] = attrs.Factory(dict)
    usage: Usage | None = None
    model: str | None = None
    finish_reason: str | None = None
    choices_seen: bool = False
    thinking_blocks: list[dict[str, Any]] = attrs.Factory(list)

    def add(self, chunk: Any) -> str | None:
        """Take one chunk in; the text it adds, if any."""
        self.model = _text(getattr(chunk, "model", None)) or self.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = _usage(chunk.usage)
        added = None
        for choice in getattr(chunk, "choices", None) or ():
            if choice.index != 0:
                continue
            self.choices_seen = True
            delta = choice.delta
            if delta.content is not None and not isinstance(delta.content, str):
                raise ModelError(
                    f"the provider streamed content that is {type(delta.content).__name__}, "
                    "not text",
                    MODEL_FAILED,
                )
            if delta.content:
                self.text.append(delta.content)
                added = delta.content
            thought = _text(getattr(delta, "reasoning_content", None))
            if thought:
                self.reasoning.append(thought)
            self._add_thinking(_thinking_blocks(getattr(delta, "thinking_blocks", None)))
            for fragment in delta.tool_calls or ():
                call = self.calls.setdefault(fragment.index, _StreamedCall())
                if fragment.id:
                    call.call_id = fragment.id
                function = fragment.function
                if function is not None:
                    if function.name and not call.name:
                        call.name = function.name
                    if function.arguments:
                        call.arguments.append(function.arguments)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return added

    def _add_thinking(self, pieces: tuple[dict[str, Any], ...]) -> None:
        """LiteLLM streams a thinking block in pieces: text, then its signature."""
        for piece in pieces:
            last = self.thinking_blocks[-1] if self.thinking_blocks else None
            if (
                last is not None
                and piece.get("type") == last.get("type") == "thinking"
                and not last.get("signature")
            ):
                last["thinking"] = str(last.get("thinking") or "") + str(
                    piece.get("thinking") or ""
                )
                if piece.get("signature"):
                    last["signature"] = piece["signature"]
            else:
                self.thinking_blocks.append(dict(piece))

    def reply(self) -> ModelReply:
        if not self.choices_seen:
            raise ModelError("the provider's stream carried no choices", MODEL_FAILED)
        if self.finish_reason is None:
            # Cut off: the connection dropped (or a proxy gave up) mid-reply. Worth retrying.
            raise ModelError(
                "the provider's stream ended before the reply was complete (no finish reason)",
                MODEL_UNAVAILABLE,
            )
        calls = []
        for index in sorted(self.calls):
            call = self.calls[index]
            if not call.name:
                raise ModelError(
                    f"the provider streamed tool call {index} without a name", MODEL_FAILED
                )
            calls.append(ToolCallRequest(call.name, "".join(call.arguments), call.call_id))
        return ModelReply(
            text="".join(self.text),
            tool_calls=tuple(calls),
            usage=self.usage,
            reasoning="".join(self.reasoning) if self.reasoning else None,
            model=self.model,
            finish_reason=self.finish_reason,
            thinking_blocks=tuple(self.thinking_blocks),
        )


def _output_limit(params: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
