"""The proxy's application: the gate, the routes, and one request through the stack."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace

from guardstack.gateway.admin import Admin
from guardstack.gateway.budgets import BudgetRefusal, Budgets
from guardstack.gateway.decision_log import DecisionLog
from guardstack.gateway.model_proxy.around import (
    KeyRing,
    NoModel,
    RefusedKeys,
    RouteSpec,
    Seen,
    check_fallbacks,
    finished_early,
    request_span,
    stack_prices,
    timed,
    tools_of,
    wire_of,
)
from guardstack.gateway.model_proxy.conversations import (
    Conversations,
    digests,
    family,
    identity,
)
from guardstack.gateway.model_proxy.exchange import Exchange, Service
from guardstack.gateway.model_proxy.gemini import GEMINI
from guardstack.gateway.model_proxy.guarding import Guard
from guardstack.gateway.model_proxy.owners import ResponseOwners, reaches_another
from guardstack.gateway.model_proxy.replies import (
    OVERHEAD_HEADER,
    STOPPED_HEADER,
    error_response,
    stop_response,
)
from guardstack.gateway.model_proxy.request import Caller, Estimate, ProxyRequest
from guardstack.gateway.model_proxy.responses import RESPONSES
from guardstack.gateway.model_proxy.routes import SELECTORS, Route, Router, read_route
from guardstack.gateway.model_proxy.upstream import (
    DEFAULT,
    Target,
    Upstream,
)
from guardstack.gateway.model_proxy.wires import ANTHROPIC, OPENAI, Malformed, Wire, parse
from guardstack.gateway.prices import PROVIDERS
from guardstack.gateway.request_log import Finished, RequestLog
from guardstack.gateway.tenants import KeyEntry, Tenants, tenants_of
from guardstack.guards.usage_costs import ObservedOutputs
from guardstack.guards.wrap_up import wrap_up_note
from guardstack.integrations._extras import require
from guardstack.integrations._gate import Gate, Refused, client_key
from guardstack.pipeline import Harness, ModelRequest
from guardstack.pipeline.decisions import decided
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.ledger import Ledger
from guardstack.pipeline.signals import PROXY_REQUESTS, STOPS
from guardstack.pipeline.validate import in_ms, integer, number

if TYPE_CHECKING:
    from httpx import AsyncBaseTransport

__all__ = ["CONVERSATION_HEADER", "STOPPED_HEADER", "ModelProxy"]

logger = logging.getLogger("guardstack")

EXTRA = "proxy"
CONVERSATION_HEADER = "x-guardstack-conversation"
#: What a request that states no output limit is estimated to produce (until its
#: model's answers are observed).
DEFAULT_OUTPUT_TOKENS: Final = 1_000


class ModelProxy:
    """The proxy's app (``.app``, a Starlette application) over ``harness``'s stack.

    ``upstream`` is the default upstream's base URL (``None``: none; requests go where
    ``routes`` send them); ``upstreams`` names others (name -> URL) for ``routes``
    (``--route SELECTOR=NAME``) and ``Fallback(stage="model", to={"upstream": NAME})``,
    with their keys in ``upstream_keys``. Every ``Fallback`` and route must name one of
    them. ``client_keys`` maps each client key to its tenant (``None``: any client, one
    tenant); ``allow_origins`` and ``allow_hosts`` are the browsers' origins and the
    host names it answers beyond loopback and ``listen_host``; ``upstream_transport`` an
    httpx transport every upstream is reached through (an ``httpx.ASGITransport`` over
    an app in process: tests, the demo); ``upstream_client`` the HTTP client that
    reaches them (``auto``: aiohttp on asyncio when installed, else httpx; ``targets``).
    """

    def __init__(
        self,
        harness: Harness,
        upstream: str | None,
        *,
        routes: Sequence[str | Route] = (),
        upstream_key: str | None = None,
        upstreams: Mapping[str, str] | None = None,
        upstream_keys: Mapping[str, str] | None = None,
        client_keys: Mapping[str, str] | None = None,
        max_body_bytes: int = 4 * 1024 * 1024,
        listen_host: str = "127.0.0.1",
        allow_origins: Collection[str] = (),
        allow_hosts: Collection[str] = (),
        drain_ms: int = 10_000,
        conversation_idle_ms: float = 3_600_000.0,
        max_conversations: int = 10_000,
        admin_key: str | None = None,
        conversation_idle_s: float | None = None,
        tenants: Tenants | None = None,
        decision_log: DecisionLog | None = None,
        stop_as: str = "answer",
        request_log: RequestLog | None = None,
        upstream_transport: AsyncBaseTransport | None = None,
        upstream_client: str = "auto",
    ) -> None:
        self.httpx = require("httpx", EXTRA)
        require("starlette", EXTRA)
        owner = "model-proxy"
        integer(owner, "max_body_bytes", max_body_bytes)
        integer(owner, "drain_ms", drain_ms, minimum=0)
        integer(owner, "max_conversations", max_conversations)
        idle_ms = in_ms(owner, "conversation_idle", conversation_idle_s, conversation_idle_ms)
        number(owner, "conversation_idle_ms", idle_ms, minimum=1e-6)
        self.harness = harness
        self.guard = Guard(harness)
        keys = dict(upstream_keys or {})
        self.upstreams: dict[str, Target] = {}
        if upstream is not None:
            self.upstreams[DEFAULT] = Target(
                self.httpx, DEFAULT, upstream, upstream_key, upstream_transport,
                client=upstream_client,
            )  # fmt: skip
        for name, url in (upstreams or {}).items():
            if name in self.upstreams:
                raise ConfigError(
                    f"model-proxy: two upstreams are named {name!r}", key="upstream", value=name
                )
            self.upstreams[name] = Target(
                self.httpx, name, url, keys.get(name), upstream_transport, client=upstream_client
            )
        if not self.upstreams:
            raise ConfigError(
                "model-proxy: no upstream: --upstream URL, or --upstream NAME=URL with --route",
                key="upstream",
                value=None,
            )
        check_fallbacks(harness, self.upstreams)
        named = [route if isinstance(route, Route) else read_route(route) for route in routes]
        #: Which upstream each request goes to (``--route``; the unnamed one otherwise).
        self.router = Router(named, self.upstreams, DEFAULT if upstream is not None else None)
        self.max_body_bytes = max_body_bytes
        if stop_as not in ("answer", "error"):
            raise ConfigError(
                f"model-proxy: --stop-as {stop_as!r}: answer or error", key="stop-as", value=stop_as
            )
        #: How a guard's stop is answered: the assistant's reply, or the API's error.
        self.stop_as = stop_as
        if tenants is None and client_keys is not None:
            tenants = tenants_of(dict(client_keys), "--keys")
        #: The tenants file's keys, scopes and budgets (``None``: any client, one tenant).
        # pause, force_open and a tool's set_limit act on the tools the clients' models
        # call, known by name only when a conversation calls them
        harness.control.tools_are = "the tools are the ones the clients' models call"
        # one budget engine: the tenants' budgets, or — with none, when the stack's own
        # usage-limit prices calls — the same engine with no limits, so every request
        # is a priced row of the spend report whichever of the two charged it
        priced = stack_prices(harness)
        counted = tenants
        if counted is None and priced and isinstance(harness.store, Ledger):
            counted = Tenants({}, {}, source="<the stack's prices>")  # no limits: rows only
        self.budgets = (
            Budgets(counted, harness.store, signals=harness.loop.signals,
                    stack_prices=priced)
            if counted is not None
            else None
        )  # fmt: skip
        #: Whom a request with no tenants file is counted as (the spend report's rows).
        self.anonymous = KeyEntry("-", "default") if tenants is None else None
        #: Client key -> tenant; ``None``: any client, one tenant.
        self.client_keys = (
            KeyRing(self.budgets) if self.budgets is not None and tenants is not None else None
        )
        #: What recent answers used, by model and tenant: budgets reserve that, not a
        #: 32,000-token ``max_tokens`` (``ObservedOutputs``).
        self.outputs = ObservedOutputs()
        self.decision_log = decision_log
        self.gate = Gate(
            listen_host=listen_host,
            keys=self.client_keys,
            allow_origins=tuple(allow_origins),
            allow_hosts=tuple(allow_hosts),
            max_body_bytes=max_body_bytes,
        )
        self.drain_s = drain_ms / 1000
        self.conversations = Conversations(
            lambda session, tenant, labels: self.harness.loop.create(
                session, model=NoModel(), tenant=tenant, labels=labels
            ),
            idle_s=idle_ms / 1000,
            most=max_conversations,
        )
        #: Which tenant each stored response belongs to (``None``: a store with no ledger).
        self.owners = ResponseOwners(harness.store) if isinstance(harness.store, Ledger) else None
        #: Streams the upstream broke off after their first byte, by API.
        self.cuts: dict[str, int] = {}
        #: What each request is lent of the proxy (``exchange.Service``).
        #: One JSON line per answered request (``--request-log``; off by default).
        self.request_log = request_log or RequestLog("off")
        self.service = Service(harness.loop, self.budgets, self.outputs, stop_as,
                               drain_ms / 1000, self.cuts, self._finished)  # fmt: skip
        #: A refused key's decision-log lines, at most one a second per client address.
        self.refused_keys = RefusedKeys()
        self.app = timed(self._build())
        if admin_key is not None:  # harness.control at /admin/control, behind its key
            admin = Admin(
                harness.control, admin_key, self.gate, budgets=self.budgets, decisions=decision_log
            )
            self.app = admin.around(self.app)

    def describe_routes(self) -> list[str]:
        """Where requests go, one line per route and the default (never a key)."""
        return self.router.describe({name: t.url for name, t in self.upstreams.items()})

    def reloaded(self) -> list[str]:
        """After the stack was reloaded (``--watch``): its ``usage-limit`` prices read
        again, so the spend report prices what the new stack charges. The lines to say."""
        priced = stack_prices(self.harness)
        if self.budgets is None:
            if not priced:
                return []
            return ["the stack's usage-limit now prices models: the spend report prices "
                    "them from the next restart (it had no priced rows to keep)"]  # fmt: skip
        if priced == self.budgets.stack_prices:
            return []
        self.budgets.reprice(priced)
        return [f"the spend report's prices reloaded: {len(priced)} from the stack's usage-limit"]

    async def aclose(self) -> None:
        for target in self.upstreams.values():
            await target.aclose()

    def attempts_allowed(self) -> int:
        """How many upstream calls one request may make: the model stage's ``Retry``."""
        from guardstack.wrappers import Retry

        most = 1
        for handle in self.harness.plugins:
            plugin = handle.plugin
            if isinstance(plugin, Retry) and plugin.stage == "model":
                most = max(most, plugin.attempts)
        return most

    # -- routes -----------------------------------------------------------------------

    def _build(self) -> Any:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.responses import Response
        from starlette.routing import Route

        async def http_error(request: Any, error: Exception) -> Any:
            status = getattr(error, "status_code", 500)
            kind = "not_found" if status == 404 else "invalid_request"
            return self._error(wire_of(request), status, kind, str(getattr(error, "detail", "")))

        async def crashed(request: Any, error: Exception) -> Any:
            logger.error("model-proxy: a request failed inside the proxy", exc_info=error)
            return self._error(wire_of(request), 500, "server", "the proxy failed this request")

        async def root(request: Any) -> Any:  # Claude Code's HEAD / at start
            return Response(b"", 200)

        return Starlette(
            routes=[
                Route("/", root, methods=["GET", "HEAD"]),
                Route("/v1/chat/completions", self._route(OPENAI), methods=["POST"]),
                Route("/v1/messages", self._route(ANTHROPIC), methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route("/v1/responses", self._route(RESPONSES), methods=["POST"]),
                Route("/v1beta/models/{target}", self._gemini, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ],
            exception_handlers={HTTPException: http_error, Exception: crashed},
        )

    def _error(self, wire: Wire, status: int, kind: str, message: str) -> Any:
        return error_response(wire, status, kind, message)

    def _route(self, wire: Wire) -> Callable[[Any], Awaitable[Any]]:
        async def route(request: Any) -> Any:
            return await self._answer(request, wire, RouteSpec(wire.path, None, None))

        return route

    async def _answer(self, request: Any, wire: Wire, route: RouteSpec) -> Any:
        """One request, answered: the proxy's own refusals in the API's shape, every
        answer with the proxy's time on it (``x-guardstack-overhead-ms``), every whole
        answer finished here (a stream's exchange finishes itself)."""
        started = time.perf_counter()
        seen = Seen()
        span = request_span(self.harness, wire, route.path)
        try:
            if span is None:
                answer = await self._proxy(request, wire, route, started, seen)
            else:  # the guards' decisions and the model stage's spans sit inside it
                with trace.use_span(span, end_on_exit=False):
                    answer = await self._proxy(request, wire, route, started, seen)
        except Refused as refused:
            if refused.status == 401:
                self.refused_keys.logged(request, refused.message)
            answer = self._error(wire, refused.status, refused.kind, refused.message)
        except Malformed as malformed:
            answer = self._error(wire, 400, "invalid_request", str(malformed))
        if isinstance(answer, Exchange):
            answer.span = span  # a stream's exchange times, finishes and ends it itself
            return answer
        if span is not None:
            span.set_attribute("http.response.status_code", answer.status_code)
            span.end()
        overhead = (time.perf_counter() - started) * 1000
        if OVERHEAD_HEADER not in answer.headers:
            answer.headers[OVERHEAD_HEADER] = f"{overhead:.2f}"
        stopped = answer.headers.get(STOPPED_HEADER)
        if seen.exchange is not None:
            seen.exchange.finished(answer.status_code, stopped)
        elif seen.request is not None or self.request_log.on:
            self._finished(finished_early(seen.request, wire, answer.status_code, stopped,
                                           started))  # fmt: skip
        return answer

    def _finished(self, finished: Finished) -> None:
        """A request answered: its request-log line and its count, by wire, upstream and
        status (``guardstack.proxy.requests``)."""
        self.request_log.write(finished)
        self.harness.loop.signals.add(
            PROXY_REQUESTS,
            1,
            {"wire": finished.wire, "upstream": finished.upstream or "none",
             "status": str(finished.status)},
        )  # fmt: skip

    async def _gemini(self, request: Any) -> Any:
        """``POST /v1beta/models/{model}:generateContent`` or ``:streamGenerateContent``."""
        target = str(request.path_params.get("target", ""))
        model, _, action = target.rpartition(":")
        if action not in ("generateContent", "streamGenerateContent") or not model:
            return self._error(GEMINI, 404, "not_found", f"no method {target!r} here")
        query = "?alt=sse" if action == "streamGenerateContent" else ""
        path = f"/v1beta/models/{model}:{action}{query}"
        return await self._answer(
            request, GEMINI, RouteSpec(path, model, action == "streamGenerateContent")
        )

    async def _models(self, request: Any) -> Any:
        from starlette.responses import Response

        try:
            self.gate.check(request.headers, "GET")
        except Refused as refused:
            return self._error(OPENAI, refused.status, refused.kind, refused.message)
        chosen = self.router.choose(OPENAI.name, "")
        if chosen is None:
            return self._error(OPENAI, 404, "not_found", "no upstream serves /v1/models here")
        target = self.upstreams[chosen]
        try:
            answer = await target.client.get("/v1/models", headers=OPENAI.headers(target.key, {}))
        except self.httpx.TransportError:
            return self._error(OPENAI, 502, "upstream", "the upstream is unreachable")
        return Response(
            answer.content, answer.status_code, media_type=answer.headers.get("content-type")
        )

    async def _count_tokens(self, request: Any) -> Any:
        """``POST /v1/messages/count_tokens`` (Claude Code asks it): forwarded with the
        proxy's key after the client's is checked; it costs nothing, so nothing is
        charged or counted."""
        from starlette.responses import Response

        try:
            self.gate.check(request.headers, "POST")
            body = await self.gate.read(request.stream())
            parse(body)
        except Refused as refused:
            return self._error(ANTHROPIC, refused.status, refused.kind, refused.message)
        except Malformed as malformed:
            return self._error(ANTHROPIC, 400, "invalid_request", str(malformed))
        chosen = self.router.choose(ANTHROPIC.name, str(parse(body).get("model") or ""))
        if chosen is None:
            return self._error(ANTHROPIC, 404, "not_found", "no upstream serves this model here")
        target = self.upstreams[chosen]
        headers = ANTHROPIC.headers(target.key, request.headers)
        try:
            answer = await target.client.post(
                "/v1/messages/count_tokens", content=body, headers=headers
            )
        except self.httpx.TransportError:
            return self._error(ANTHROPIC, 502, "upstream", "the upstream is unreachable")
        return Response(
            answer.content, answer.status_code, media_type=answer.headers.get("content-type")
        )

    # -- one request ------------------------------------------------------------------

    async def _proxy(
        self, request: Any, wire: Wire, route: RouteSpec, started: float, seen: Seen
    ) -> Any:
        headers = {name.lower(): value for name, value in request.headers.items()}
        if wire is GEMINI and not headers.get("x-goog-api-key"):
            key = request.query_params.get("key")
            if key:
                headers["x-goog-api-key"] = key
        if self.budgets is not None:
            await self.budgets.refresh()  # keys issued or budgets changed meanwhile
        tenant = self.gate.check(headers, "POST")
        entry = self.budgets.key(client_key(headers)) if self.budgets is not None else None
        caller = Caller.of(entry, tenant)
        body = await self.gate.read(request.stream())
        data = parse(body)
        wire.check(data)
        model = route.model or str(data.get("model") or "guardstack")
        chosen = self.router.choose(wire.name, model)
        if chosen is None:
            why = f"no upstream serves model {model!r} on the {SELECTORS[wire.name]} API here"
            return self._error(wire, 404, "not_found", why)
        if tenant is not None:
            refused = await reaches_another(self.owners, wire, tenant, data)
            if refused is not None:
                return refused
        if entry is not None and self.budgets is not None:
            allowed = self.budgets.models_allowed(entry, model)
            if allowed is not None:
                why = f"model {model!r} is not one {entry.id!r} may use; allowed: {allowed}"
                decided("refuse", layer="budgets", decision="model_not_allowed", reason=why,
                        tenant=caller.tenant, team=caller.team, key_name=caller.key_id,
                        model=model)  # fmt: skip
                return self._error(wire, 403, "permission", why)
        messages = wire.messages(data)
        system = wire.system_text(data, messages)
        name = identity(headers, CONVERSATION_HEADER, system, wire.first_prompt(messages), data)
        history = digests(messages)
        retried = headers.get("x-stainless-retry-count", "0") not in ("", "0")
        call_ids = [call_id for call_id, *_ in wire.calls(messages)]
        conversation, fresh = self.conversations.get(
            tenant, name, history, resend=retried, call_ids=call_ids, labels=caller.labels(),
            related=family(headers, CONVERSATION_HEADER, system),
        )  # fmt: skip
        limit = wire.max_tokens(data) or DEFAULT_OUTPUT_TOKENS
        observed = self.outputs.estimate((model, entry.tenant)) if entry is not None else None
        output = min(limit, observed) if observed is not None else limit
        served = ProxyRequest(
            wire=wire,
            target=self.upstreams[chosen],
            path=route.path,
            data=data,
            body=body,
            headers=headers,
            caller=caller,
            conversation=conversation,
            fresh=fresh,
            model=model,
            stream=route.stream if route.stream is not None else bool(data.get("stream")),
            messages=messages,
            history=history,
            estimate=Estimate(wire.input_tokens(data), output * wire.choices(data)),
            started=started,
        )
        seen.request = served
        return await self._guarded(served, request.receive, seen)

    async def _guarded(self, request: ProxyRequest, receive: Any, seen: Seen) -> Any:
        wire, conversation, messages = request.wire, request.conversation, request.messages
        agent = conversation.agent
        if request.fresh:  # met again after it was freed: only its current turn is new here
            before = wire.turn_start(messages)
            conversation.calls.update(call_id for call_id, *_ in wire.calls(messages[:before]))
        guard = self.guard
        await guard.start_turn_if_new(conversation, wire, messages)
        stopped, reminders = await guard.history(conversation, wire, messages)
        if stopped is not None:
            return self._stopped(request, stopped)
        agent.start_step()  # each request forwarded is one step of the conversation's turn
        forwarded, changed = request.data, False
        if reminders:
            forwarded, changed = wire.remind(forwarded, reminders), True
        held = wrapped = None
        if self.budgets is not None and (request.caller.entry or self.anonymous) is not None:
            spent = await self._reserve(request, forwarded)
            if not isinstance(spent, tuple):
                return spent  # refused: the stop, or the API's 429
            held, wrapped = spent
            if wrapped is not None:
                forwarded, changed = wrapped, True
        asked = wire.ask_for_usage(forwarded) if request.stream else None
        if asked is not None:
            forwarded, changed = asked, True
        upstream = Upstream(
            request,
            forwarded,
            json.dumps(forwarded).encode() if changed else request.body,  # exact unless changed
            targets=self.upstreams,
            owners=self.owners,
        )
        upstream.strip_usage = asked is not None
        upstream.decide = guard.deciding(
            conversation, lambda plugin, text: self.service.stopped(request, plugin, text)
        )
        upstream.attempts = guard.attempts(
            conversation, [wire.name, request.model, request.target.name, *request.history]
        )
        upstream.allowed = self.attempts_allowed()
        if wire is GEMINI:
            upstream.turn = GEMINI.model_turns(messages) + 1
        call = ModelRequest(agent, upstream.messages, tools_of(forwarded), model=upstream)
        exchange = seen.exchange = Exchange(self.service, request, call, upstream)
        exchange.held = held
        if wrapped is not None:
            exchange.stopped_by = "budgets"
        if request.stream:
            return exchange  # an ASGI response: the stream goes out from inside the call
        return await exchange.answered(receive)

    async def _reserve(self, request: ProxyRequest, data: dict[str, Any]) -> Any:
        """The request's estimate reserved in every scope's windows: ``(held, None)``; or
        past a budget that wraps up, ``(held, the request as its last call)``; or the
        budget's stop, answered as ``--stop-as`` says (the model's last words, or the
        API's 429 that no client retries)."""
        budgets, entry = self.budgets, request.caller.entry or self.anonymous
        assert budgets is not None
        assert entry is not None
        wire, estimate = request.wire, request.estimate
        conversation = request.conversation
        session = request.conversation_id
        try:
            held = await budgets.reserve(
                entry, session, request.model, estimate.input_tokens, estimate.output_tokens,
                provider=PROVIDERS.get(wire.name),
            )  # fmt: skip
        except Exception as error:  # a budget fails closed: nothing is sent uncounted
            logger.warning("model-proxy: the budgets' store failed: %s", type(error).__name__)
            why = f"the budgets' store is not answering ({type(error).__name__}); nothing is sent"
            request.decided("refuse", layer="budgets", decision="store_down", reason=why)
            return error_response(wire, 503, "overloaded", why, {"retry-after": "5"})
        if not isinstance(held, BudgetRefusal):
            return held, None
        refusal = held
        budget = refusal.scope.budget
        if budget.on_limit == "wrap_up" and not conversation.wrapped:
            tokens = budget.wrap_up_tokens
            last = await budgets.reserve(
                entry, session, request.model, estimate.input_tokens, tokens, wrap_up=True,
                provider=PROVIDERS.get(wire.name),
            )  # fmt: skip
            if not isinstance(last, BudgetRefusal):
                conversation.wrapped = True
                signals = self.harness.loop.signals
                request.decided("stop", layer="budgets", decision="wrap_up",
                                reason=refusal.message, signals=signals)  # fmt: skip
                return last, wire.wrap_up(data, wrap_up_note(refusal.message), tokens)
            refusal = last
        request.decided("budget_refused", layer="budgets", decision="refuse",
                        reason=refusal.message, signals=self.harness.loop.signals)  # fmt: skip
        tenant = request.caller.tenant or "default"
        self.harness.loop.signals.add(STOPS, 1, {"layer": "budgets", "tenant": tenant})
        headers = {STOPPED_HEADER: "budgets"}
        if refusal.retry_after_s is not None:
            headers["retry-after"] = str(max(1, math.ceil(refusal.retry_after_s)))
        if self.stop_as == "error":
            return error_response(wire, 429, "rate_limit", refusal.message,
                                  {**headers, "x-should-retry": "false"})  # fmt: skip
        headers.pop("retry-after", None)
        return stop_response(wire, "budgets", refusal.message, request.model, request.stream,
                             headers, structured=request.structured)  # fmt: skip

    def _stopped(self, request: ProxyRequest, stopped: tuple[str, str]) -> Any:
        """A stop decided on the history, before anything went upstream — or, when no
        upstream call of the turn worked, the upstream's last error instead."""
        from starlette.responses import Response

        conversation = request.conversation
        failure = conversation.failed
        if not conversation.succeeded and failure is not None:
            status, content, media = failure
            return Response(content, status, media_type=media)
        plugin, text = stopped
        self.service.stopped(request, plugin, text)
        as_error = self.stop_as == "error"
        return stop_response(request.wire, plugin, text, request.model, request.stream, {},
                             as_error=as_error, structured=request.structured)  # fmt: skip
