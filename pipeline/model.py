"""The model seam: what a model is given, what it answers, and how it fails.

A model is any object with ``async complete(messages, tools) -> ModelReply``:
``messages`` in OpenAI chat format (rebuilt from the session log for every
request) and ``tools`` as OpenAI function schemas. ``integrations.openai`` adapts
any OpenAI-compatible API; ``ScriptedModel``, the test double, is in
``pipeline.testing``.

Every model call goes through the loop's ``model_call`` stage as a
``ModelRequest``. A failed call is an exception: ``ModelError`` with one of the
``MODEL_*`` codes tells the wrappers (a model-stage ``Retry``, ``Timeout``,
``Metrics``) what kind of failure it was; anything else is ``MODEL_FAILED``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias, runtime_checkable

import attrs

from guardstack.pipeline.call_context import DEFAULT_TENANT
from guardstack.pipeline.frozen import copy_with, passes, quick_init
from guardstack.pipeline.model_members import model_name_of, reports_chunks, stated_output_limit
from guardstack.pipeline.values import message_of

if TYPE_CHECKING:
    from guardstack.pipeline.loop import Agent

__all__ = [
    "MODEL_FAILED",
    "MODEL_OVERLOADED",
    "MODEL_RATE_LIMITED",
    "MODEL_REJECTED",
    "MODEL_TIMEOUT",
    "MODEL_UNAVAILABLE",
    "ChunkListener",
    "Model",
    "ModelError",
    "ModelReply",
    "ModelRequest",
    "ToolCallRequest",
    "Usage",
    "answering_model",
    "arguments_text",
    "input_estimate",
    "model_error_code",
    "reports_chunks",
    "stated_output_limit",
]

#: The provider refused for now: too many requests (HTTP 429). Worth retrying later.
MODEL_RATE_LIMITED: Final = "MODEL_RATE_LIMITED"
#: The provider could not answer: a 5xx, a dropped connection. Worth retrying.
MODEL_UNAVAILABLE: Final = "MODEL_UNAVAILABLE"
#: The call took longer than a model-stage ``Timeout`` (or the client's own timeout).
MODEL_TIMEOUT: Final = "MODEL_TIMEOUT"
#: The provider says it is overloaded (Anthropic's 529), or a model-stage queue is full.
MODEL_OVERLOADED: Final = "MODEL_OVERLOADED"
#: The request was refused: bad request, authentication, context length. Not retried.
MODEL_REJECTED: Final = "MODEL_REJECTED"
#: Anything else: a reply that could not be used, an unexpected exception.
MODEL_FAILED: Final = "MODEL_FAILED"


class ModelError(Exception):
    """A model call failed; ``code`` says how, ``retry_after_s`` when the provider said.

    ``layer`` names the guardstack layer that raised it (``None``: the model or its
    adapter did); ``refused`` marks a guardstack layer's own refusal (an open breaker,
    a full limit), which no breaker counts as the provider failing. ``partial`` is the
    text a stream had delivered when a ``Timeout`` cut it (the loop logs it when the
    failure ends the turn).
    """

    def __init__(
        self,
        message: str,
        code: str = MODEL_FAILED,
        retry_after_s: float | None = None,
        *,
        layer: str | None = None,
        refused: bool = False,
        partial: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.layer = layer
        self.refused = refused
        self.partial = partial

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"ModelError({self.message!r}, {self.code!r}, retry_after_s={self.retry_after_s!r})"


def noted(error: BaseException, note: str) -> ModelError:
    """``error`` with ``note`` added to its message (``"… (note)"``), as a ``ModelError``
    that keeps everything the failure carried — its code, ``refused``,
    ``retry_after_s``, ``layer``, the partial reply, and its class — so a layer that
    says why it stopped never turns guardstack's own refusal into a provider's
    failure. Any other exception becomes a ``ModelError`` of its code, caused by it."""
    if isinstance(error, ModelError):
        message = f"{error.message} ({note})"
        try:
            explained = copy.copy(error)
        except Exception:  # a subclass that cannot be made again from its args
            explained = ModelError(
                message, error.code, error.retry_after_s, layer=error.layer,
                refused=error.refused, partial=error.partial,
            )  # fmt: skip
        explained.message = message
        explained.args = (message, *error.args[1:])
    else:
        explained = ModelError(f"{message_of(error)} ({note})", MODEL_FAILED)
    explained.__cause__ = error
    return explained


def model_error_code(error: BaseException) -> str:
    """The ``MODEL_*`` code of a failure: a ``ModelError``'s own, else ``MODEL_FAILED``."""
    return error.code if isinstance(error, ModelError) else MODEL_FAILED


#: ``json.dumps(…, ensure_ascii=False, allow_nan=False)`` without a new encoder per call.
_ARGUMENTS_JSON: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def _count(value: object) -> int:
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a token count must be a whole number >= 0, got {value!r}")
    return value


@quick_init
@attrs.frozen
class Usage:
    """Tokens one model call (or a sum of them) used; ``+`` adds two.

    ``input_tokens`` counts all input, read from a prompt cache or not, and includes
    ``cached_input_tokens`` (the cache reads) and ``cache_write_tokens`` (input written
    to the cache, which Anthropic's prices charge above plain input); ``output_tokens``
    includes ``reasoning_tokens`` (the providers' own convention).
    """

    input_tokens: int = attrs.field(default=0, converter=_count)
    output_tokens: int = attrs.field(default=0, converter=_count)
    cached_input_tokens: int = attrs.field(default=0, converter=_count)
    reasoning_tokens: int = attrs.field(default=0, converter=_count)
    cache_write_tokens: int = attrs.field(default=0, converter=_count)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        """The non-zero counts (the log's form)."""
        return {key: value for key, value in attrs.asdict(self).items() if value}


#: No tokens: what a turn starts from (values are frozen, so one serves every turn).
NO_USAGE: Final = Usage()


def _text(value: object) -> str:
    """A name or id as text whatever a provider sent (``None`` is empty: the loop gives the
    call an id, the registry answers an empty name ``UNKNOWN_TOOL``), so the log loads."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return _safe_str(value)


passes(str, _text)


def _safe_str(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _parse_arguments(arguments: Mapping[str, Any] | str) -> Mapping[str, Any] | str:
    """A model's argument text as a mapping: ``""`` is ``{}``; non-objects stay raw text."""
    if not isinstance(arguments, str):
        return arguments
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def arguments_text(arguments: Mapping[str, Any] | str) -> str:
    """The JSON text of a call's arguments as it goes on the wire and into the log.

    Raw text is kept verbatim; a mapping JSON cannot hold is written with its
    unserialisable parts replaced by a ``"<unserialisable T>"`` marker, so the log
    stays valid JSON (the registry answers such a call with ``INVALID_ARGUMENTS``).
    """
    if isinstance(arguments, str):
        return arguments
    try:
        return _ARGUMENTS_JSON(arguments)
    except (TypeError, ValueError, RecursionError):
        return json.dumps(_json_safe(arguments, 0), ensure_ascii=False)


def _json_safe(value: object, depth: int) -> object:
    if isinstance(value, int) and value.bit_length() > 14_000:
        return f"<integer with {value.bit_length()} bits>"  # beyond what JSON text can hold
    if isinstance(value, str | bool | int | type(None)):
        return value
    if isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")):
        return value
    if depth < 32 and isinstance(value, Mapping):
        try:
            items = list(value.items())
        except Exception:  # a hostile mapping whose iteration raises
            return f"<unreadable {type(value).__name__}>"
        return {_safe_str(key): _json_safe(item, depth + 1) for key, item in items}
    if depth < 32 and isinstance(value, list | tuple):
        return [_json_safe(item, depth + 1) for item in value]
    return f"<unserialisable {type(value).__name__}>"


@quick_init
@attrs.frozen
class ToolCallRequest:
    """One tool call a model asked for.

    ``arguments`` may be a mapping or the raw JSON text the model produced: ``""``
    becomes ``{}``, a JSON object becomes a dict, anything else stays the raw text
    and is answered with ``INVALID_ARGUMENTS``. Raw text is also kept verbatim in
    ``arguments_json``, so the log replays exactly what the model said.
    """

    name: str = attrs.field(converter=_text)
    arguments: Mapping[str, Any] | str = attrs.field(factory=dict)
    call_id: str = attrs.field(default="", converter=_text)
    raw_arguments: str | None = attrs.field(init=False, repr=False)
    _json: str = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        parsed = _parse_arguments(self.arguments)
        raw = self.arguments if isinstance(self.arguments, str) else None
        text = arguments_text(parsed)  # once: every later request reuses it
        if raw is not None and not isinstance(parsed, str) and raw == text:
            raw = None  # the text says nothing the mapping does not: equal either way
        object.__setattr__(self, "raw_arguments", raw)
        object.__setattr__(self, "arguments", parsed)
        object.__setattr__(self, "_json", raw if raw is not None else text)

    def with_call_id(self, call_id: str) -> ToolCallRequest:
        """The same request under another id, raw text kept."""
        return copy_with(self, call_id=_text(call_id))  # nothing parsed or written again

    @property
    def arguments_json(self) -> str:
        """The arguments as the model wrote them (or as JSON, if given as a mapping)."""
        return self._json


def _requests(requests: Iterable[ToolCallRequest]) -> tuple[ToolCallRequest, ...]:
    return tuple(requests)


def as_thinking_blocks(blocks: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """A reply's thinking blocks as a tuple (the converter of the fields that hold them)."""
    return tuple(blocks)


passes(tuple, _requests, as_thinking_blocks)


@quick_init
@attrs.frozen
class ModelReply:
    """A model's answer: text, and the tool calls it wants run (in its order).

    ``usage`` is what the call cost, ``reasoning`` the model's thinking text (sent
    back to the provider on later requests, as DeepSeek requires), ``model`` the
    model that answered and ``finish_reason`` why it stopped — all optional.
    ``thinking_blocks`` are a provider's signed thinking blocks (Anthropic's
    ``thinking`` and ``redacted_thinking``), opaque mappings kept exactly as they came:
    the log keeps them and later requests send them back unchanged.
    """

    text: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = attrs.field(default=(), converter=_requests)
    usage: Usage | None = None
    reasoning: str | None = None
    model: str | None = None
    finish_reason: str | None = None
    thinking_blocks: tuple[Mapping[str, Any], ...] = attrs.field(
        default=(), converter=as_thinking_blocks
    )


@quick_init
@attrs.frozen(eq=False)
class ModelRequest:
    """One model call on its way through the ``model_call`` stage.

    ``messages`` is the session's rebuilt request (read-only: pass a changed copy
    inward with ``attrs.evolve``); ``attempt`` is set by a model-stage ``Retry``
    for the layers inside it, ``hedge`` by a model-stage ``Hedge`` (0: the first).
    The model itself is handed fresh copies of the messages: nothing it does to them
    changes the log.
    """

    agent: Agent
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    attempt: int = 1
    hedge: int = 0
    #: The model that answers, when not the agent's own (a child agent's call charged
    #: to its parent's caps: ``AgentTool``).
    model: Model | None = attrs.field(default=None, kw_only=True)
    #: Its place in the admission layers' queues: higher is served first, first come
    #: first served within a priority (``None``: the agent's priority).
    priority: int | None = attrs.field(default=None, kw_only=True)
    #: Told of each piece of a streamed reply as it arrives (its text, ``""`` for a
    #: piece without text): set by a ``Timeout`` with ``first_byte_ms`` or ``idle_ms``,
    #: and handed to a model that ``reports_chunks``.
    on_chunk: ChunkListener | None = attrs.field(default=None, kw_only=True, repr=False)

    @property
    def tenant(self) -> str | None:
        """A model request names no tenant of its own: its agent's counts (``CallContext``).
        Not a field: one more slot to fill costs every model call ~50 ns."""
        return None

    # -- the rest of the call context every layer reads (``CallContext``) ---------------

    @property
    def key(self) -> str:
        return self.model_name

    @property
    def label(self) -> str:
        return f"model {self.model_name}"

    @property
    def model_name(self) -> str:
        """The model it goes to — its own (a child's, the model proxy's upstream), else its
        agent's — by that model's ``model`` attribute, else ``model``."""
        answering = self.model if self.model is not None else self.agent.model
        return model_name_of(answering) or "model"

    @property
    def budget_ms(self) -> int | None:
        return None  # a model declares no budget: a model-stage timeout names its own

    @property
    def may_repeat(self) -> bool:
        return True

    @property
    def tool_name(self) -> str | None:
        return None

    @property
    def queue_priority(self) -> int:
        priority = self.priority
        return priority if priority is not None else self.agent.priority

    @property
    def owner(self) -> str:
        return self.agent.tenant or DEFAULT_TENANT

    @property
    def listener(self) -> ChunkListener | None:
        return self.on_chunk

    def with_listener(self, listener: ChunkListener) -> ModelRequest:
        return attrs.evolve(self, on_chunk=listener)

    def with_attempt(self, attempt: int) -> ModelRequest:
        return self if self.attempt == attempt else attrs.evolve(self, attempt=attempt)

    def with_hedge(self, hedge: int) -> ModelRequest:
        return self if self.hedge == hedge else attrs.evolve(self, hedge=hedge)


#: What a streamed reply's pieces are told to: a plain callable taking each piece's text.
ChunkListener: TypeAlias = Callable[[str], None]


@runtime_checkable
class Model(Protocol):
    """Anything that answers a chat request.

    A model that streams may also report each piece of its reply as it arrives, so a
    ``Timeout(first_byte_ms=…, idle_ms=…)`` can tell a stream that never starts or that
    stalls from one that is simply long: it sets ``reports_chunks = True`` and takes
    ``complete(messages, tools, *, on_chunk=None)``, calling ``on_chunk(text)`` (a plain
    callable; ``""`` for a piece without text) for every piece it receives."""

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> ModelReply: ...


def answering_model(request: ModelRequest) -> object:
    """The model that answers a request (a child's own, for a call charged to its parent)."""
    return request.model if request.model is not None else request.agent.model


def input_estimate(messages: Iterable[Mapping[str, Any]]) -> int:
    """A request's input tokens before a provider counts them: a token per four
    characters of its messages' content, plus one (the stated rule caps reserve by)."""
    return sum(len(str(message.get("content") or "")) for message in messages) // 4 + 1
