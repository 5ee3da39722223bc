"""The upstream side: the model the stack's model stage calls is one POST of the
(forwarded) body, and a stream is relayed to the client from inside that call.

* **Passthrough is exact.** A JSON answer is kept as it came (``answer``) and handed to
  the client byte for byte; a stream goes out chunk by chunk as it arrives — except,
  when the proxy asked the upstream for the stream's usage and the client did not,
  the one event that carries only usage, which is read and not sent on.
* **Every stream is charged.** The usage a stream reports is the reply's; a client
  that leaves mid-stream stops getting bytes, but the proxy reads on to the usage
  event, for at most ``drain_s``, so the call is charged what the upstream reported
  (past ``drain_s``, the call is cancelled and charged its reservation).
* **Failures are classified.** An upstream that cannot be reached, or whose body is
  cut short before any byte reached the client, is ``MODEL_UNAVAILABLE`` (a ``Retry``
  may send it again); once a byte has gone, the request is never made again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio

from guardstack.gateway.model_proxy.closing import Closing, closing_for
from guardstack.gateway.model_proxy.targets import DEFAULT, Target
from guardstack.gateway.model_proxy.wires import Wire
from guardstack.integrations._provider import status_error
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_UNAVAILABLE,
    ChunkListener,
    ModelError,
    ModelReply,
    Usage,
)

if TYPE_CHECKING:
    from guardstack.gateway.model_proxy.answers import Decide, Editor
    from guardstack.gateway.model_proxy.guarding import Attempts
    from guardstack.gateway.model_proxy.owners import ResponseOwners
    from guardstack.gateway.model_proxy.request import ProxyRequest

__all__ = ["DEFAULT", "PROVIDER_NAMES", "Target", "Upstream", "Via"]


logger = logging.getLogger("guardstack")


#: The GenAI conventions' provider names, by the wire a request came in on.
PROVIDER_NAMES: Final = {
    "openai": "openai", "responses": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini",
}  # fmt: skip


class Upstream:
    """The model one request's model stage calls (see the module docstring).

    ``model`` and ``max_tokens`` are the request's own: what a spend cap prices and
    reserves. Layers that add the person's words to the request (``BudgetNotice``)
    hand ``complete`` a longer message list; the body is written again only then."""

    def __init__(
        self,
        request: ProxyRequest,
        data: dict[str, Any],
        body: bytes,
        *,
        targets: Mapping[str, Target],
        owners: ResponseOwners | None = None,
    ) -> None:
        wire = request.wire
        self.request, self.wire, self.data, self.body = request, wire, data, body
        #: The upstreams a layer may send it to by name (``Fallback``), the routed one
        #: first; and where replies the provider stores are recorded as the tenant's.
        self.targets, self.owners = targets, owners
        self.client_headers = request.headers
        self.stream = request.stream
        self.model = request.model
        #: ``gen_ai.provider.name``: the API family the client speaks.
        self.provider = PROVIDER_NAMES.get(wire.name, "_OTHER")
        #: What a spend cap reserves: the output limit the request states (times the
        #: answers it asks for; ``None``: the cap's own estimate) and its input, as its
        #: wire counts it.
        stated = wire.max_tokens(data)
        self.max_tokens = stated * wire.choices(data) if stated is not None else None
        self.input_tokens = request.estimate.input_tokens
        #: The message list the model stage was given: anything a layer adds after it
        #: is the person's words to add to the body.
        self.messages = wire.messages(data)
        #: The usage-only stream event is not the client's: it did not ask for it.
        self.strip_usage = False
        #: The last upstream answer that was not relayed: (status, body, content type).
        self.answer: tuple[int, bytes, str | None] | None = None
        self.send: Any = None
        self.started = False  # a byte of a streamed reply has reached the client
        #: The upstream answered (its status and headers came): it may bill from here.
        self.reached = False
        #: What the stream being relayed has reported so far (its usage, if any).
        self.tally: StreamTally | None = None
        self.gone = False  # the client left: read on for the usage, send nothing
        #: The upstream's stream was read to its end (not stopped partway by a layer).
        self.read_to_end = False
        #: What went out of the stream, to end it cleanly if a guard stops it partway.
        self.closing: Closing = Closing()
        #: Whose request it is (``None``: the proxy has no tenants): a reply the provider
        #: stores is recorded as this tenant's.
        self.tenant = request.caller.tenant
        #: What decides the tool calls an answer asks for, before the agent runs them.
        self.decide: Decide | None = None
        #: Where the request goes upstream (the wire's path; Gemini's names the model).
        self.path = request.path
        #: The headers a stream's answer starts with, beside its content type.
        self.start_headers: Callable[[], list[tuple[bytes, bytes]]] = list
        #: Seconds spent waiting on the upstream (the proxy's overhead excludes them).
        self.waited_s = 0.0
        #: This operation's upstream calls across a client's resends (``None``: not
        #: counted), and how many it may make in all.
        self.attempts: Attempts | None = None
        self.allowed = 1
        #: The upstream it goes to unless a layer sends it elsewhere (the routed one).
        self.default = request.target.name
        #: Which of the model's answers this request's is (its history's count, plus one).
        self.turn = 0
        #: The id the stream's events name it by (Responses), once seen.
        self.response_id: str | None = None
        #: A stream's status, content type and editor, for the response's start.
        self.status = 200
        self.media = "text/event-stream"
        self.editor: Editor | None = None

    def with_model(self, model: str) -> Via:
        """The same request, asking the default upstream for ``model`` (a ``UsageLimit``'s
        downgrade to a cheaper model)."""
        return Via(self, self.default, model)

    def upstream(self, name: str, *, model: str | None = None) -> Via:
        """The same request to the upstream ``name`` (``Fallback(to={"upstream": …})``)."""
        return Via(self, name, model)

    #: A stream's pieces are reported as they arrive (a ``Timeout``'s ``first_byte_ms``
    #: and ``idle_ms`` bound them); a reply that does not stream is one piece.
    reports_chunks = True
    #: An agent's ``max_tokens`` says little of its answers (Claude Code asks 32,000 on
    #: every request): a ``UsageLimit`` with ``estimate: auto`` reserves what that
    #: model's answers used instead (``ObservedOutputs``).
    observed_estimates = True

    async def complete(
        self, messages: Any, tools: Any, *, on_chunk: ChunkListener | None = None
    ) -> ModelReply:
        return await self.post(self.targets[self.default], None, messages, on_chunk)

    def _body(self, model: str | None, messages: Any) -> bytes:
        added = (
            messages[len(self.messages) :]
            if isinstance(messages, list)
            and len(messages) > len(self.messages)
            and messages[: len(self.messages)] == self.messages
            else []
        )
        if model is None and not added:
            return self.body
        data = json.loads(self.body)
        if added:
            texts = [str(m.get("content", "")) for m in added if isinstance(m, Mapping)]
            data = self.wire.remind(data, texts)
        if model is not None:
            data["model"] = model
        return json.dumps(data).encode()

    async def post(
        self,
        target: Target,
        model: str | None,
        messages: Any = None,
        on_chunk: ChunkListener | None = None,
    ) -> ModelReply:
        if self.started:
            raise ModelError(
                "the reply had begun reaching the client: the request is not made again",
                MODEL_FAILED,
            )
        transport_error = target.transport_errors
        self._count_attempt(target)
        headers = self.wire.headers(target.key, self.client_headers)
        body = self._body(model, messages)
        self.answer = None
        asked_at = time.perf_counter()
        try:
            response = await target.post(self.path, body, headers)
        except transport_error as error:
            raise ModelError(
                f"upstream {target.name!r} unreachable ({type(error).__name__})", MODEL_UNAVAILABLE
            ) from error
        finally:
            self.waited_s += time.perf_counter() - asked_at
        self.reached = self.reached or response.status_code < 400
        try:
            if response.status_code >= 400 or not self.stream:
                asked_at = time.perf_counter()
                try:
                    content = await response.aread()
                except transport_error as error:  # the body cut short
                    raise ModelError(
                        f"upstream {target.name!r} cut its reply short ({type(error).__name__})",
                        MODEL_UNAVAILABLE,
                    ) from error
                finally:
                    self.waited_s += time.perf_counter() - asked_at
                self.answer = (
                    response.status_code,
                    content,
                    response.headers.get("content-type"),
                )
                if response.status_code >= 400:
                    if self.attempts is not None:
                        failure = (*self.answer, dict(response.headers))
                        self.attempts.failures[target.name] = failure
                    raise status_error(
                        response.status_code,
                        f"upstream {target.name!r} answered {response.status_code}",
                        response.headers,
                    )
                await self._owned(self.wire.response_id(content))
                return self.wire.reply_of(content)
            return await self._relay(response, target, on_chunk)
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    def _count_attempt(self, target: Target) -> None:
        """One more upstream call of this operation — or, when its resends have used
        every attempt the stack allows, its last failure again without going upstream."""
        attempts = self.attempts
        if attempts is None:
            return
        used = attempts.used.get(target.name, 0)
        if used >= self.allowed:
            failure = attempts.failures.get(target.name)
            if failure is None:
                raise ModelError(
                    f"not sent to upstream {target.name!r} again: this request's "
                    f"{used} attempts are used (the client resent it)",
                    MODEL_UNAVAILABLE,
                )
            status, content, media, headers = failure
            self.answer = (status, content, media)
            raise status_error(
                status,
                f"upstream {target.name!r} answered {status} (not sent again: this "
                f"request's {used} attempts are used)",
                headers,
            )
        attempts.used[target.name] = used + 1

    def reported_usage(self) -> Usage | None:
        """What the stream relayed last reported before it ended (``None``: nothing)."""
        return self.tally.usage if self.tally is not None else None

    def response_headers(self, media: str) -> list[tuple[bytes, bytes]]:
        return [(b"content-type", media.encode()), *self.start_headers()]

    async def _owned(self, response_id: str | None) -> None:
        """Record a reply the provider stores as this request's tenant's (``owners``)."""
        owners = self.owners
        if response_id is None or self.tenant is None or owners is None:
            return
        try:
            with anyio.CancelScope(shield=True):
                await owners.record(response_id, self.tenant)
        except Exception:  # its continuation is refused, as for an id never relayed
            logger.warning("model-proxy: could not record whose response %s is", response_id)

    async def _emit(self, body: bytes) -> None:
        """Bytes of the stream to the client; the response starts with the first of
        them (so a stop decided before any is named in its headers)."""
        if not body:
            return
        if not self.started:
            self.started = True
            headers = self.response_headers(self.media)
            stop = self.editor.stop if self.editor is not None else None
            if stop is not None:
                from guardstack.gateway.model_proxy.guarding import plugin_of

                headers.append(
                    (b"x-guardstack-stopped", plugin_of(stop[len("Stopped by ") :]).encode())
                )
            await self._deliver(
                {"type": "http.response.start", "status": self.status, "headers": headers}
            )
        await self._deliver({"type": "http.response.body", "body": body, "more_body": True})

    async def _deliver(self, message: dict[str, Any]) -> None:
        if self.gone:
            return
        try:
            with anyio.CancelScope(shield=True):  # whole events, or none: never half a one
                await self.send(message)
        except OSError:  # the client went away under us
            self.gone = True

    async def _relay(
        self, response: Any, target: Target, on_chunk: ChunkListener | None = None
    ) -> ModelReply:
        """The upstream's stream to the client as it arrives, event by event (an SSE
        event is whole at its blank line); the usage it reports. The answer's editor
        (``answers.Editor``) may hold its tool calls until they are decided."""
        wire = self.wire
        pending = b""
        tally = self.tally = StreamTally(wire)
        closing = self.closing = closing_for(wire.name)
        editor = None
        if self.decide is not None:
            from guardstack.gateway.model_proxy.answers import editor_for

            editor = editor_for(wire.name, self.decide, self.turn)
        asked_at: float | None = time.perf_counter()
        self.media = response.headers.get("content-type", "text/event-stream")
        self.status = response.status_code
        self.editor = editor
        try:
            async for chunk in response.aiter_raw():
                if not chunk:
                    continue
                if on_chunk is not None:
                    on_chunk("")
                if asked_at is not None:
                    self.waited_s += time.perf_counter() - asked_at  # to its first byte
                    asked_at = None
                events, pending = _whole_events(pending + chunk)
                out: list[bytes] = []
                for raw, event in events:
                    if event is not None:
                        stored = wire.response_id_in(event)
                        if stored is not None:
                            self.response_id = stored
                            await self._owned(stored)
                        tally.add(event)
                        if self.strip_usage and wire.is_usage_only(event):
                            continue
                    out.append(raw if editor is None else await editor.feed(raw, event))
                    closing.see(event)
                    if on_chunk is not None and event is not None:
                        text = wire.text_in(event)
                        if text:
                            on_chunk(text)  # a layer reading the text (a loop in it) sees it
                if out:
                    await self._emit(b"".join(out))
        except target.transport_errors as error:
            code = MODEL_FAILED if self.started else MODEL_UNAVAILABLE
            raise ModelError(
                f"the upstream's stream broke ({type(error).__name__})", code
            ) from error
        rest = (await editor.finish() if editor is not None else b"") + pending
        await self._emit(rest)
        self.read_to_end = True  # the upstream's own ending went out
        return ModelReply("", usage=tally.usage, model=tally.model or self.model)


class StreamTally:
    """What a stream's events say it cost, by its wire's ``usage_in`` over each event in
    turn; ``usage`` is ``None`` when no event said (charged its reservation). ``model``
    is the model the events say answered (priced as the unstreamed answer's is)."""

    __slots__ = ("_said", "_seen", "model", "wire")

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self._said: Usage | None = None
        self._seen = False
        self.model: str | None = None

    def add(self, event: Any) -> None:
        before = self._said
        self._said = self.wire.usage_in(event, before)
        self._seen = self._seen or self._said is not before
        if self.model is None:
            self.model = _answering_model(event)

    @property
    def usage(self) -> Usage | None:
        return self._said if self._seen else None


def _answering_model(event: Any) -> str | None:
    """The model an event names: a chat chunk's ``model``, Anthropic's ``message_start``,
    a Responses event's ``response``, a Gemini chunk's ``modelVersion``."""
    if not isinstance(event, Mapping):
        return None
    for holder in (event, event.get("message"), event.get("response")):
        if isinstance(holder, Mapping):
            name = holder.get("model") or holder.get("modelVersion")
            if isinstance(name, str) and name:
                return name
    return None


def stream_usage(wire: Wire, pieces: Iterable[bytes]) -> Usage | None:
    """What a stream arriving in ``pieces`` (cut anywhere) is charged: as the proxy's
    relay reads it, event by event."""
    tally, pending = StreamTally(wire), b""
    for piece in pieces:
        events, pending = _whole_events(pending + piece)
        for _, event in events:
            if event is not None:
                tally.add(event)
    return tally.usage


def _whole_events(buffer: bytes) -> tuple[list[tuple[bytes, Any]], bytes]:
    """The whole SSE events at the front of ``buffer`` — each as it came, with the JSON of
    its ``data:`` line (``None`` for none) — and what is left of an event still arriving."""
    events: list[tuple[bytes, Any]] = []
    while True:
        raw, buffer = _next_event(buffer)
        if raw is None:
            return events, buffer
        events.append((raw, _event_in(raw)))


def _next_event(buffer: bytes) -> tuple[bytes | None, bytes]:
    """The first whole SSE event of ``buffer`` (up to and with its blank line), and the
    rest; ``None`` while no event is whole yet."""
    ends = [end for end in (buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")) if end >= 0]
    if not ends:
        return None, buffer
    end = min(ends)
    width = 4 if buffer.startswith(b"\r\n\r\n", end) else 2
    return buffer[: end + width], buffer[end + width :]


def _event_in(raw: bytes) -> Any:
    """The JSON of an event's ``data:`` line, or ``None``."""
    for line in raw.splitlines():
        found = _event_of(line)
        if found is not None:
            return found
    return None


def _event_of(line: bytes) -> Any:
    """The JSON of an SSE ``data:`` line, or ``None``."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if not payload.startswith(b"{"):
        return None
    try:
        event = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) else None


class Via:
    """The request, sent to another of the proxy's upstreams (a ``Fallback``'s target)."""

    def __init__(self, upstream: Upstream, name: str, model: str | None) -> None:
        self.upstream, self.name, self.model = upstream, name, model
        self.max_tokens = upstream.max_tokens
        self.input_tokens = upstream.input_tokens

    reports_chunks = True
    observed_estimates = True

    async def complete(
        self, messages: Any, tools: Any, *, on_chunk: ChunkListener | None = None
    ) -> ModelReply:
        target = self.upstream.targets.get(self.name)
        if target is None:
            raise ModelError(f"no upstream named {self.name!r}", MODEL_FAILED)
        return await self.upstream.post(target, self.model, messages, on_chunk)
