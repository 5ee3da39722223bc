"""One request through the proxy's model stage, and how each way it ends is answered.

* **An answer** goes to the client as it came (passthrough is exact), except for the
  tool calls a stop takes out of it (``answers``). A JSON answer is whole before it is
  sent; a stream goes out from inside the call, event by event.
* **A stop** a guard asks for is the assistant's reply, naming the plugin in
  ``x-guardstack-stopped`` — unless every upstream call of the turn failed: then it is
  the upstream's own last error, never a cap's stop ("the agent looped" would be
  wrong).
* **A failure** is the upstream's own error, status and body; a refusal by a layer of
  the stack (an open breaker, a rate limit) 429 or 503 with ``Retry-After``; a wait
  a timeout ended 504; else 502.
* **A stream cut after its first byte** ends with the API's own error event
  (Anthropic's ``event: error``, Responses' ``response.failed``, an error chunk on
  chat completions and Gemini): never a clean end.
* **An answer paid for is an answer delivered**: whatever goes wrong in the proxy after
  the upstream answered is logged, and the answer still goes out.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from guardstack.gateway.model_proxy.conversations import Conversation
from guardstack.gateway.model_proxy.guarding import plugin_of
from guardstack.gateway.model_proxy.replies import (
    NOT_RETRIED,
    OVERHEAD_HEADER,
    STOPPED_HEADER,
    error_response,
    stop_response,
)
from guardstack.gateway.model_proxy.upstream import Upstream
from guardstack.gateway.request_log import Finished
from guardstack.guards.loop_detector.text_watch import LOOP_CUT
from guardstack.pipeline import (
    MODEL_RATE_LIMITED,
    MODEL_TIMEOUT,
    ModelError,
    ModelReply,
    ModelRequest,
    TurnBlocked,
    Usage,
)
from guardstack.pipeline.signals import PROXY_OVERHEAD, STOPS, STREAM_CUTS

if TYPE_CHECKING:
    from guardstack.gateway.budgets import Budgets, Held
    from guardstack.gateway.model_proxy.request import ProxyRequest
    from guardstack.guards.usage_costs import ObservedOutputs
    from guardstack.pipeline import AgentLoop

__all__ = ["Exchange", "Service"]

logger = logging.getLogger("guardstack")


@attrs.frozen(eq=False)
class Service:
    """What the proxy lends each request it serves: the loop whose model stage runs it,
    the budgets, what answers used, how a stop is answered, how long a gone client's
    answer is read on, and the count of streams cut. Nothing else of the proxy."""

    loop: AgentLoop
    budgets: Budgets | None
    outputs: ObservedOutputs
    stop_as: str
    drain_s: float
    cuts: dict[str, int]
    #: Told of every request answered (the request log and the requests counted).
    finished: Callable[[Finished], None] = attrs.field(default=lambda finished: None)

    def stopped(self, request: ProxyRequest, plugin: str, text: str) -> None:
        """A guard's stop is answered: one decision-log line, one stop counted."""
        request.decided(
            "stop", layer=plugin, decision="end_turn", reason=text, signals=self.loop.signals
        )
        tenant = request.about()["tenant"] or "default"
        self.loop.signals.add(STOPS, 1, {"layer": plugin, "tenant": tenant})

    def count_cut(self, request: ProxyRequest) -> None:
        """An upstream stream broke off after its first byte (the client got the API's
        error event): counted, logged, a decision-log line."""
        wire = request.wire
        self.cuts[wire.name] = self.cuts.get(wire.name, 0) + 1
        logger.warning("model-proxy: an upstream %s stream broke off mid-answer", wire.name)
        why = "the upstream's stream broke off mid-answer; the client got the API's error event"
        request.decided("stream_cut", layer="upstream", decision="error_event", reason=why)
        self.loop.signals.add(STREAM_CUTS, 1, {"wire": wire.name})


class Exchange:
    """One request through the model stage. For a stream, also its ASGI response: the
    chain runs inside it, the upstream's events go out as they arrive, and a stop or an
    error before the first of them is answered whole instead."""

    def __init__(
        self, service: Service, request: ProxyRequest, call: ModelRequest, upstream: Upstream
    ) -> None:
        self.service, self.request, self.call = service, request, call
        self.conversation: Conversation = request.conversation
        self.agent = self.conversation.agent
        self.upstream, self.model = upstream, request.model
        #: When the proxy began this request (``time.perf_counter``): its overhead is
        #: the time since, less the upstream's.
        self.started = request.started
        #: What the request holds in its scopes' budgets (settled after the call).
        self.held: Held | None = None
        #: The plugin whose stop this answer is, when it is one (a budget's wrap-up).
        self.stopped_by: str | None = None
        self.recorded = False
        #: What the answer used and cost, once known (the request log's).
        self.usage: Usage | None = None
        self.usd: float | None = None
        #: The request's SERVER span, when the stack traces: a stream ends it at its end.
        self.span: Any = None

    def finished(self, status: int, stopped: str | None) -> None:
        """The request is answered: its line in the request log, its count."""
        elapsed_ms = (time.perf_counter() - self.started) * 1000
        self.service.finished(
            self.request.finished(
                status, stopped or self.stopped_by, ms=elapsed_ms,
                overhead_ms=self.overhead_ms(), usage=self.usage, usd=self.usd,
            )
        )  # fmt: skip

    def overhead_ms(self) -> float:
        spent = time.perf_counter() - self.started - self.upstream.waited_s
        return max(0.0, spent * 1000)

    def headers(self) -> dict[str, str]:
        """The answer's headers: the proxy's own time so far (recorded once, as the
        ``guardstack.proxy.overhead`` histogram, when the answer's headers are first
        made), and the stop's layer if it is one."""
        overhead = self.overhead_ms()
        if not self.recorded:
            self.recorded = True
            wire = self.upstream.wire.name
            self.service.loop.signals.add(PROXY_OVERHEAD, overhead / 1000, {"wire": wire})
        headers = {OVERHEAD_HEADER: f"{overhead:.2f}"}
        if self.stopped_by is not None:
            headers[STOPPED_HEADER] = self.stopped_by
        return headers

    async def run(self) -> ModelReply:
        loop = self.service.loop
        try:
            reply = await loop.call_model(self.call)  # every layer and hook of the stage
        except BaseException:
            self.conversation.state = "failed"
            await self._settle(None)
            raise
        self.conversation.state = "answered"
        self.usage = reply.usage if isinstance(reply, ModelReply) else None
        await self._settle(reply)
        self.conversation.succeeded = True
        if self.upstream.attempts is not None:
            self.upstream.attempts.answered()
        if isinstance(reply, ModelReply) and reply.usage is not None:
            try:
                loop.charge(self.agent, reply.usage, self.call)
            except Exception:  # the answer was paid for: it is delivered whatever happens
                logger.exception("model-proxy: counting a reply's usage failed")
        return reply

    async def _settle(self, reply: ModelReply | None) -> None:
        """The budgets' reservation settled at what the upstream reported; given back
        when nothing reached it. A store that fails then is logged: the answer goes out."""
        held, budgets = self.held, self.service.budgets
        if held is None or budgets is None:
            return
        self.held = None
        upstream = self.upstream
        try:
            with anyio.CancelScope(shield=True):
                if reply is None and upstream.answer is None and not upstream.reached:
                    await budgets.release(held)  # it never reached the upstream
                    self.usd = 0.0
                    return
                # an answer's usage; a stream cut short: what it reported before the cut,
                # never less than its reservation (the provider may have billed more)
                usage = reply.usage if reply is not None else upstream.reported_usage()
                model = reply.model if reply is not None else None
                self.usage = usage
                self.usd = await budgets.settle(held, usage, model, at_least_reserved=reply is None)
                if usage is not None:
                    key = (held.model, held.scopes[0].label)
                    self.service.outputs.seen(key, usage.output_tokens)
        except Exception:
            logger.exception("model-proxy: settling a request's budgets failed")

    async def until_done(self, receive: Any) -> ModelReply | None:
        """``run()``; a client that disconnects stops getting bytes, and the call is let
        finish for ``drain_s`` (so its usage is known), then cancelled."""
        answer: ModelReply | None = None
        upstream = self.upstream

        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    with contextlib.suppress(OSError):
                        while (await receive())["type"] != "http.disconnect":
                            pass
                    upstream.gone = True
                    await anyio.sleep(self.service.drain_s)
                    group.cancel_scope.cancel()  # it did not finish in time: charged as is

                group.start_soon(watch)
                try:
                    answer = await self.run()
                finally:
                    group.cancel_scope.cancel()
        except BaseExceptionGroup as failed:  # the call's own error, as itself
            if len(failed.exceptions) == 1:
                raise failed.exceptions[0] from None
            raise
        return answer

    # -- how it ended ---------------------------------------------------------------------

    def stopped(self, blocked: TurnBlocked) -> Any:
        earlier = self.conversation.failed
        if not self.conversation.succeeded and earlier is not None:
            return self.upstream_failure(earlier)  # nothing worked: that is the news
        text = str(blocked)
        plugin = plugin_of(text)
        self.service.stopped(self.request, plugin, text)
        return stop_response(self.upstream.wire, plugin, text, self.model,
                             self.upstream.stream, self.headers(),
                             as_error=self.service.stop_as == "error",
                             structured=self.request.structured)  # fmt: skip

    def upstream_failure(self, failure: tuple[int, bytes, str | None]) -> Any:
        from starlette.responses import Response

        status, content, media = failure
        headers = self.headers()
        if status in NOT_RETRIED:
            headers["x-should-retry"] = "false"
        return Response(content, status, media_type=media, headers=headers)

    def failed(self, error: ModelError) -> Any:
        """The upstream's own error, status and body, or in the API's shape when none
        answered: a refusal by a layer of the stack 429 or 503 with ``Retry-After``, a
        timeout 504, else 502 (unreachable, or its reply cut short)."""
        wire = self.upstream.wire
        answer = self.upstream.answer
        if answer is not None:
            self.conversation.failed = answer
            if answer[0] >= 500 or answer[0] == 429:
                self._upstream_failed(str(answer[0]), error.message)
            return self.upstream_failure(answer)
        headers = self.headers()
        if not error.refused and not self.upstream.started:
            # could not be reached, timed out, or broke off before the client had a byte
            # (after that, the stream's cut is its own line)
            self._upstream_failed(error.code, error.message)
        if error.refused:  # a layer of the stack answered: an open breaker, a limit
            status = 429 if error.code == MODEL_RATE_LIMITED else 503
            kind = "rate_limit" if status == 429 else "overloaded"
            if error.retry_after_s:
                headers["retry-after"] = str(max(1, math.ceil(error.retry_after_s)))
            return error_response(wire, status, kind, error.message, headers)
        if error.code == MODEL_TIMEOUT:
            return error_response(wire, 504, "upstream", error.message, headers)
        return error_response(wire, 502, "upstream", "the upstream did not answer in full", headers)

    def _upstream_failed(self, decision: str, why: str) -> None:
        """An upstream that failed or could not be reached: a decision-log line naming
        the upstream (operators see what fails, not only what guardstack refused)."""
        target = self.request.target.name
        self.request.decided(
            "upstream_failed", layer="upstream", decision=decision, reason=f"{target}: {why}"
        )

    async def answered(self, receive: Any) -> Any:
        """A JSON request's answer (the call run to its end here)."""
        from starlette.responses import Response

        upstream = self.upstream
        try:
            reply = await self.until_done(receive)
        except TurnBlocked as blocked:
            return self.stopped(blocked)
        except ModelError as error:
            return self.failed(error)
        if reply is None:  # the client went away and the upstream did not answer in time
            return Response(b"", 499)
        status, content, media = upstream.answer or (502, b"", None)
        stop = None
        if status < 400 and upstream.decide is not None:
            content, stop = await self._decided(content)
        headers = self.headers()
        if stop is not None:
            plugin = plugin_of(stop[len("Stopped by ") :])
            if self.service.stop_as == "error":
                return stop_response(upstream.wire, plugin, stop, self.model, False, headers,
                                     as_error=True)  # fmt: skip
            headers[STOPPED_HEADER] = plugin
        return Response(content, status, media_type=media, headers=headers)

    async def _decided(self, content: bytes) -> tuple[bytes, str | None]:
        from guardstack.gateway.model_proxy.answers import edit_json

        upstream = self.upstream
        assert upstream.decide is not None
        try:
            return await edit_json(upstream.wire.name, content, upstream.decide, upstream.turn)
        except Exception:  # an answer paid for is delivered
            logger.exception("model-proxy: deciding an answer's tool calls failed")
            return content, None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        span = self.span
        if span is None:
            await self._stream(scope, receive, send)
            return
        from opentelemetry import trace

        with trace.use_span(span, end_on_exit=True):  # decisions on the stream are its events
            await self._stream(scope, receive, send)

    async def _stream(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.responses import Response

        upstream = self.upstream
        upstream.send = send
        upstream.start_headers = lambda: [
            (name.encode(), value.encode()) for name, value in self.headers().items()
        ]
        instead: Any = None
        stop: str | None = None  # a guard's stop after the stream began: a clean end
        try:
            reply = await self.until_done(receive)
            if reply is not None and reply.finish_reason == LOOP_CUT:
                stop = "Stopped by loop-detector: the answer started repeating itself and was cut"
        except TurnBlocked as blocked:
            if upstream.started:
                stop = f"Stopped by {plugin_of(str(blocked))}: {blocked}"
                self.service.stopped(self.request, plugin_of(str(blocked)), str(blocked))
            else:
                instead = self.stopped(blocked)
        except ModelError as error:
            instead = self.failed(error)
        except Exception:
            if not upstream.started:
                raise
            logger.exception("model-proxy: the proxy failed after the stream began")
            instead = None  # the answer went out: it ends as it is
        if upstream.gone:
            self.finished(499, stop)
            return
        if not upstream.started:
            if instead is None:  # an empty stream: answered empty, as it came
                status, content, media = upstream.answer or (200, b"", None)
                instead = Response(content, status, media_type=media or "text/event-stream")
            await instead(scope, receive, send)
            self.finished(instead.status_code, instead.headers.get(STOPPED_HEADER))
            return
        ending = b""
        if stop is not None and not upstream.read_to_end:  # stopped partway: a clean end
            ending = upstream.closing.close(f"\n\n{stop}")
        elif instead is not None:  # the upstream's stream broke after its first bytes went out
            self.service.count_cut(self.request)
            ending = upstream.wire.cut_events(
                "the upstream's stream broke off mid-answer", upstream.response_id
            )
        with anyio.CancelScope(shield=True), contextlib.suppress(OSError):  # a client gone
            await send({"type": "http.response.body", "body": ending, "more_body": False})
        self.finished(upstream.status, plugin_of(stop[len("Stopped by ") :]) if stop else None)
