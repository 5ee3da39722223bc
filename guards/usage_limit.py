"""Usage limit: hard caps on tokens per turn and per session, and on dollars per session.

``tokens_per_turn`` and ``tokens_per_session`` cap input plus output tokens (as the
replies' ``usage`` reports them; a resumed session counts what its log holds);
``usd_per_session`` caps what the session's model calls cost, priced from
``prices``, a mapping of model name to ``(usd_per_million_input_tokens,
usd_per_million_output_tokens)``, optionally followed by the price of a million
cache reads and of a million cache writes (``[3, 15, 0.3, 3.75]`` for a Claude
model). Without them, cache reads are priced as input (a discount only makes the
real bill lower) and cache writes at twice the input price (Anthropic's highest
cache-write rate), so a cap never lets the bill run past it for want of a price.

The check runs before each model request, on what the replies so far used: once
a limit is reached the request is not sent and the turn ends with reason
``blocked``, ``TurnResult.error`` naming the limit and the amount. A reply can
overshoot a limit by its own size; the next request is the one refused.

A cost limit never guesses a price: the reply's model name (else the name the
agent's model was asked for) must be in ``prices``, or the first reply raises
``ConfigError`` naming the model and the prices it knows (the turn ends ``error``).

Where it belongs: a ``model_call`` layer. It reads what the loop tallied, so it
counts the same wherever it sits; inside a model-stage ``Retry`` its refusal is
never retried.

The session's spend is kept in the harness's ``StateStore`` (or ``store=``) under
its session id; a store that fails ends the turn (a spend cap fails closed, unless
the store's ``on_error`` says ``"open"``).
"""

from __future__ import annotations

import datetime
import logging
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

import anyio
import attrs

from guardstack.pipeline.contract import (
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
    StateStore,
    Usage,
)
from guardstack.pipeline.errors import ConfigError, GuardstackWarning, TurnBlocked
from guardstack.pipeline.signals import USAGE_USD
from guardstack.pipeline.validate import invalid, number, optional_integer

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["UsageLimit"]

logger = logging.getLogger("guardstack")

PLUGIN: Final = "usage-limit"


def _check_usd(_: Any, __: Any, value: Any) -> None:
    if value is not None and number(PLUGIN, "usd_per_session", value) <= 0:
        raise invalid(PLUGIN, "usd_per_session", value, "a positive number of dollars")


Price = tuple[float, float, float, float]
PRICE_FORM = "[usd per million input, output] (then cache reads, cache writes)"


def _check_tenant(_: Any, __: Any, value: Any) -> None:
    if value is not None and not callable(value) and not (isinstance(value, str) and value):
        raise invalid(PLUGIN, "tenant", value, "a name, a function of the model request, or None")


def _check_warn_at(_: Any, __: Any, value: Any) -> None:
    if value is not None and not (0 < number(PLUGIN, "warn_at", value) < 1):
        raise invalid(PLUGIN, "warn_at", value, "a fraction between 0 and 1")


def _windows(now: float) -> dict[str, str]:
    """The calendar (UTC) window each limit counts in at ``now``."""
    moment = datetime.datetime.fromtimestamp(now, tz=datetime.UTC)
    return {"day": moment.strftime("%Y-%m-%d"), "month": moment.strftime("%Y-%m")}


def _prices(value: object) -> dict[str, Price] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise invalid(PLUGIN, "prices", value, f"a mapping of model name to {PRICE_FORM}")
    prices: dict[str, Price] = {}
    for model, pair in value.items():
        if not isinstance(model, str) or not model:
            raise invalid(PLUGIN, "prices", value, "keyed by model names")
        if isinstance(pair, str) or not isinstance(pair, list | tuple) or not 2 <= len(pair) <= 4:
            raise invalid(PLUGIN, f"prices.{model}", pair, PRICE_FORM)
        given = [number(PLUGIN, f"prices.{model}", price) for price in pair]
        per_input, per_output = given[0], given[1]
        cache_read = given[2] if len(given) > 2 else per_input
        cache_write = given[3] if len(given) > 3 else 2 * per_input
        prices[model] = (per_input, per_output, cache_read, cache_write)
    return prices


@attrs.frozen
class UsageLimit:
    """Caps on tokens per turn and per session, and on dollars per session."""

    name: ClassVar[str] = PLUGIN

    tokens_per_turn: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "tokens_per_turn")
    )
    tokens_per_session: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "tokens_per_session")
    )
    usd_per_session: float | None = attrs.field(default=None, validator=_check_usd)
    prices: Mapping[str, Price] | None = attrs.field(default=None, converter=_prices)
    #: Calendar (UTC) windows, one counter per tenant shared by every agent and process.
    usd_per_day: float | None = attrs.field(default=None, kw_only=True, validator=_check_usd)
    usd_per_month: float | None = attrs.field(default=None, kw_only=True, validator=_check_usd)
    tokens_per_day: int | None = attrs.field(
        default=None, kw_only=True, validator=optional_integer(PLUGIN, "tokens_per_day")
    )
    #: Whose windows a call counts in: a name, a function of the ``ModelRequest``, or
    #: ``None``: the agent's own ``tenant`` if it has one (the model proxy sets each
    #: client key's), else one tenant for every agent of this plugin.
    tenant: str | Callable[[ModelRequest], str] | None = attrs.field(
        default=None, kw_only=True, validator=_check_tenant
    )
    #: At this fraction of a window's limit, one ``GuardstackWarning`` (across processes).
    warn_at: float | None = attrs.field(default=None, kw_only=True, validator=_check_warn_at)
    #: What a call reserves for its output when the model states no ``max_tokens``.
    estimate_output_tokens: int = attrs.field(
        default=1_000, kw_only=True, validator=optional_integer(PLUGIN, "estimate_output_tokens")
    )
    #: Where the spend is kept (``None``: the harness's store).
    store: StateStore | None = attrs.field(default=None, kw_only=True, repr=False)

    def __attrs_post_init__(self) -> None:
        limits = (
            self.tokens_per_turn,
            self.tokens_per_session,
            self.usd_per_session,
            self.usd_per_day,
            self.usd_per_month,
            self.tokens_per_day,
        )
        if all(limit is None for limit in limits):
            raise invalid(
                PLUGIN,
                "tokens_per_turn",
                None,
                "set (or `tokens_per_session`, `usd_per_session`, `usd_per_day`, "
                "`usd_per_month`, `tokens_per_day`); with none it caps nothing",
            )
        dollars = (self.usd_per_session, self.usd_per_day, self.usd_per_month)
        if any(limit is not None for limit in dollars) and self.prices is None:
            raise invalid(
                PLUGIN,
                "prices",
                None,
                f"given with a dollar limit (model name -> {PRICE_FORM})",
            )

    def price(self, model: str | None, fallback: str | None) -> Price:
        """The prices for a reply's model (else the requested one): input, output, cache
        reads, cache writes per million tokens; never a guess."""
        prices = self.prices or {}
        for name in (model, fallback):
            if name is not None and name in prices:
                return prices[name]
        known = ", ".join(sorted(prices)) or "none"
        raise ConfigError(
            f"{PLUGIN}: no price for model {model or fallback!r} (known: {known}); a cost "
            "limit never guesses, so add it to `prices`",
            plugin=PLUGIN,
            key="prices",
            value=model or fallback,
        )

    def cost_usd(self, usage: Usage, model: str | None, fallback: str | None) -> float:
        """What ``usage`` cost at the model's price."""
        per_input, per_output, per_read, per_write = self.price(model, fallback)
        plain = max(0, usage.input_tokens - usage.cached_input_tokens - usage.cache_write_tokens)
        return (
            plain * per_input
            + usage.cached_input_tokens * per_read
            + usage.cache_write_tokens * per_write
            + usage.output_tokens * per_output
        ) / 1_000_000

    def check(self, agent: Agent, spent_usd: float) -> None:
        """Raise ``TurnBlocked`` if the agent has reached a limit."""
        turn_tokens = agent.turn_usage.total_tokens
        session_tokens = agent.usage.total_tokens
        if self.tokens_per_turn is not None and turn_tokens >= self.tokens_per_turn:
            raise TurnBlocked(
                f"{PLUGIN}: this turn used {turn_tokens} tokens and the limit is "
                f"{self.tokens_per_turn} per turn"
            )
        if self.tokens_per_session is not None and session_tokens >= self.tokens_per_session:
            raise TurnBlocked(
                f"{PLUGIN}: this session used {session_tokens} tokens and the limit is "
                f"{self.tokens_per_session} per session"
            )
        if self.usd_per_session is not None and spent_usd >= self.usd_per_session:
            raise TurnBlocked(
                f"{PLUGIN}: this session cost ${spent_usd:.4f} and the limit is "
                f"${self.usd_per_session:.4f} per session"
            )

    def apply(self, scope: Scope) -> None:
        """Register the checking model-call layer, with fresh per-session spend counters."""
        store = scope.store_for(self.store)
        namespace = scope.namespace
        signals = scope.signals

        def tenant_of(request: ModelRequest, otherwise: str = "all") -> str:
            """Whose windows (and spend metric) a call counts in; ``otherwise`` for none
            (the windows' stored keys say ``all``; the metrics say ``default``, as the
            loop's token counts do)."""
            if callable(self.tenant):
                return str(self.tenant(request))
            return self.tenant or getattr(request.agent, "tenant", None) or otherwise

        seen: weakref.WeakSet[Agent] = weakref.WeakSet()
        tracks_cost = self.usd_per_session is not None

        def logged_cost(agent: Agent, fallback: str | None) -> float:
            total = 0.0
            for event in agent.session.events:
                usage = getattr(event, "usage", None)
                if event.type == "assistant/message" and usage is not None:
                    total += self.cost_usd(usage, getattr(event, "model", None), fallback)
            return total

        async def spent(agent: Agent, key: str, asked_for: str | None) -> float:
            if agent in seen:
                return await store.read(key)
            seen.add(agent)  # a session this process has not seen: what its log cost
            _, total = await store.add(key, 0.0, initial=logged_cost(agent, asked_for))
            return total

        async def model_layer(request: ModelRequest, call_next: ModelNext) -> ModelReply:
            agent = request.agent
            asked_for = _model_name(agent)
            key = f"{namespace}:usd:{agent.session_id}"
            so_far = 0.0
            if tracks_cost:
                try:
                    so_far = await spent(agent, key, asked_for)
                except ConfigError:
                    raise
                except Exception as error:
                    _fail_closed(store, error)
            self.check(agent, so_far)
            reply = await call_next(request)
            if (
                self.prices is not None
                and isinstance(reply, ModelReply)
                and reply.usage is not None
            ):
                spent_now = self.cost_usd(reply.usage, reply.model, asked_for)
                signals.add(USAGE_USD, spent_now, {"tenant": tenant_of(request, "default")})
            if tracks_cost and isinstance(reply, ModelReply) and reply.usage is not None:
                cost = self.cost_usd(reply.usage, reply.model, asked_for)
                try:
                    await store.add(key, cost)
                except Exception:
                    # The reply is paid for and kept; the next check asks the store again
                    # (and fails closed if it still cannot answer).
                    logger.warning(
                        "%s: the %s store did not record a reply's cost ($%.6f)",
                        PLUGIN,
                        store.name,
                        cost,
                        exc_info=True,
                    )
            return reply

        windows = [
            (kind, period, limit)
            for kind, period, limit in (
                ("usd", "day", self.usd_per_day),
                ("usd", "month", self.usd_per_month),
                ("tokens", "day", self.tokens_per_day),
            )
            if limit is not None
        ]

        async def remaining(agent: Agent) -> dict[str, float]:
            """What is left of every limit that applies (for ``BudgetNotice``)."""
            tokens: list[float] = []
            usd: list[float] = []
            if self.tokens_per_turn is not None:
                tokens.append(self.tokens_per_turn - agent.turn_usage.total_tokens)
            if self.tokens_per_session is not None:
                tokens.append(self.tokens_per_session - agent.usage.total_tokens)
            try:
                if self.usd_per_session is not None:
                    key = f"{namespace}:usd:{agent.session_id}"
                    usd.append(self.usd_per_session - await spent(agent, key, _model_name(agent)))
                if windows and not callable(self.tenant):
                    periods = _windows(getattr(store, "wall_clock", time.time)())
                    for kind, period, limit in windows:
                        key = (
                            f"{namespace}:{self.tenant or 'all'}:{kind}:{period}:{periods[period]}"
                        )
                        (usd if kind == "usd" else tokens).append(limit - await store.read(key))
            except Exception:
                logger.debug("%s: could not read what is left", PLUGIN, exc_info=True)
            left = {"tokens": min(tokens, default=None), "usd": min(usd, default=None)}
            return {key: max(0.0, value) for key, value in left.items() if value is not None}

        scope.adopt(scope.loop.ledger.report_remaining(remaining))
        if not windows:
            scope.use(scope.loop.model_call, model_layer, name=PLUGIN)
            return

        async def reserve(
            tenant: str, periods: dict[str, str], estimate: dict[str, float]
        ) -> tuple[list[tuple[str, float]], str | None]:
            """Reserve ``estimate`` in every window (all or none): the reservations, or
            the refusal naming the window that is full."""
            reserved: list[tuple[str, float]] = []
            try:
                for kind, period, limit in windows:
                    key = f"{namespace}:{tenant}:{kind}:{period}:{periods[period]}"
                    added, total = await store.add(key, estimate[kind], limit=limit)
                    if not added:
                        await _give_back(store, reserved)
                        unit = f"${total:.4f}" if kind == "usd" else f"{total:g} tokens"
                        bound = f"${limit:.4f}" if kind == "usd" else f"{limit:g} tokens"
                        return [], (
                            f"{PLUGIN}: tenant {tenant!r} has used {unit} this {period} and "
                            f"the limit is {bound} per {period} (this call's reservation "
                            "would pass it)"
                        )
                    reserved.append((key, estimate[kind]))
            except BaseException:
                await _give_back(store, reserved)
                raise
            return reserved, None

        async def windowed(request: ModelRequest, call_next: ModelNext) -> ModelReply:
            """Reserve against every window, run the call, settle what it really cost."""
            tenant = tenant_of(request)
            asked_for = _model_name(request.agent)
            now = getattr(store, "wall_clock", time.time)()
            periods = _windows(now)
            estimate = self.estimate(request, asked_for)
            try:
                reserved, refusal = await reserve(tenant, periods, estimate)
            except ConfigError:
                raise
            except Exception as error:
                _fail_closed(store, error)
                return await model_layer(request, call_next)
            if refusal is not None:
                raise TurnBlocked(refusal)
            try:
                reply = await model_layer(request, call_next)
            except BaseException:
                await _give_back(store, reserved)
                raise
            usage = reply.usage if isinstance(reply, ModelReply) else None
            priced = usage is not None and (self.usd_per_day or self.usd_per_month)
            actual = {
                "usd": self.cost_usd(usage, reply.model, asked_for) if priced and usage else 0.0,
                "tokens": float(usage.total_tokens) if usage else 0.0,
            }
            for (key, amount), (kind, period, limit) in zip(reserved, windows, strict=True):
                try:
                    _, total = await store.add(key, actual[kind] - amount)
                    if self.warn_at is not None and total >= self.warn_at * limit:
                        first, _ = await store.add(f"{key}:warned", 1, limit=1)
                        if first:
                            warnings.warn(
                                f"{PLUGIN}: tenant {tenant!r} has used {total:g} of its "
                                f"{limit:g} {kind} this {period} ({self.warn_at:.0%} warning)",
                                GuardstackWarning,
                                stacklevel=2,
                            )
                except Exception:
                    logger.warning("%s: could not settle a reservation", PLUGIN, exc_info=True)
            return reply

        scope.use(scope.loop.model_call, windowed, name=PLUGIN)

    def estimate(self, request: ModelRequest, asked_for: str | None) -> dict[str, float]:
        """What a call reserves before it is made: its input (a token per four characters
        of the request, the stated rule) and its output (the model's ``max_tokens``, else
        ``estimate_output_tokens``), in tokens and, at the model's price, in dollars."""
        characters = sum(len(str(message.get("content") or "")) for message in request.messages)
        input_tokens = characters // 4 + 1
        stated = getattr(request.agent.model, "max_tokens", None)
        output = stated if isinstance(stated, int) and stated > 0 else self.estimate_output_tokens
        usd = 0.0
        if self.prices is not None and (self.usd_per_day or self.usd_per_month):
            usd = self.cost_usd(Usage(input_tokens, output), None, asked_for)
        return {"usd": usd, "tokens": float(input_tokens + output)}


def _fail_closed(store: StateStore, error: Exception) -> None:
    """A spend cap's answer to a failing store: end the turn, unless the store says open."""
    if store.on_error != "open":
        raise TurnBlocked(
            f"{PLUGIN}: its {store.name} store is not answering "
            f"({type(error).__name__}); no model call is made without it"
        ) from error


async def _give_back(store: StateStore, reserved: list[tuple[str, float]]) -> None:
    with anyio.CancelScope(shield=True):
        for key, amount in reserved:
            try:
                await store.add(key, -amount)
            except Exception:
                logger.warning("%s: could not give a reservation back", PLUGIN, exc_info=True)


def _model_name(agent: Agent) -> str | None:
    name = getattr(agent.model, "model", None)
    return name if isinstance(name, str) else None
