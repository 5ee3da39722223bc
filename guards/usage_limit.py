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

import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from guardstack.pipeline.contract import (
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
    StateStore,
    Usage,
)
from guardstack.pipeline.errors import ConfigError, TurnBlocked
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
    #: Where the spend is kept (``None``: the harness's store).
    store: StateStore | None = attrs.field(default=None, kw_only=True, repr=False)

    def __attrs_post_init__(self) -> None:
        limits = (self.tokens_per_turn, self.tokens_per_session, self.usd_per_session)
        if all(limit is None for limit in limits):
            raise invalid(
                PLUGIN,
                "tokens_per_turn",
                None,
                "set (or `tokens_per_session` or `usd_per_session`); with none it caps nothing",
            )
        if self.usd_per_session is not None and self.prices is None:
            raise invalid(
                PLUGIN,
                "prices",
                None,
                f"given with `usd_per_session` (model name -> {PRICE_FORM})",
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
                    if store.on_error != "open":
                        raise TurnBlocked(
                            f"{PLUGIN}: its {store.name} store is not answering "
                            f"({type(error).__name__}); no model call is made without it"
                        ) from error
            self.check(agent, so_far)
            reply = await call_next(request)
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

        scope.use(scope.loop.model_call, model_layer, name=PLUGIN)


def _model_name(agent: Agent) -> str | None:
    name = getattr(agent.model, "model", None)
    return name if isinstance(name, str) else None
