"""Usage limit: hard caps on tokens and dollars per turn, per session and per calendar window.

``tokens_per_turn`` and ``tokens_per_session`` cap input plus output tokens (as the
replies' ``usage`` reports them; a resumed session counts what its log holds);
``usd_per_session`` caps what the session's model calls cost, priced from
``prices``, a mapping of model name to ``(usd_per_million_input_tokens,
usd_per_million_output_tokens)``, optionally followed by the price of a million
cache reads and of a million cache writes (``[3, 15, 0.3, 3.75]`` for a Claude
model). Without them, cache reads are priced as input (a discount only makes the
real bill lower) and cache writes at twice the input price (Anthropic's highest
cache-write rate), so a cap never lets the bill run past it for want of a price.
``usd_per_day``, ``usd_per_month`` and ``tokens_per_day`` are calendar (UTC) windows
of a *tenant*, shared by every agent and process using the store.

**Every call is reserved before it is sent.** Its estimate — its input (a token per
four characters of the request) plus its output limit (the answering model's
``max_tokens``, else ``estimate_output_tokens``), priced at that model's price, or at
the highest price in ``prices`` when the request names no model it knows — is added to
every window that applies, all or none. A call whose reservation would pass a limit
is not sent: the turn ends with reason ``blocked``, ``TurnResult.error`` naming the
limit and the amount. After the call the reservation is settled at what the reply
reports (priced at the reply's model). So calls running at once — parallel child
agents, several processes on one session or tenant — together pass a limit by at most
the error of their estimates: nothing, when each estimate is at least its call's real
cost. A reply without usage, a timeout or a cancelled call is charged its reservation;
a call the provider refused outright (429, 400) or another layer refused is given back.

A cost limit never guesses a price low: a reply naming a model that is not in
``prices`` is charged at the highest price the table holds — the price its reservation
was made at — and a warning names the model once (``guardstack check`` says so before
it happens, for a model the stack names). The answer is delivered either way: it was
paid for.

Where it belongs: a ``model_call`` layer. Outside a model-stage ``Retry`` it reserves
for the whole operation at once (the estimate of one attempt: give the model a
``max_tokens`` that covers them, or put it inside); inside it, each attempt; its
refusal is never retried.

What it counts lives in the harness's store (or ``store=``), through its ``Ledger``:
a session's for the session's lifetime and never less than its log holds, a turn's
until the turn ends, a calendar window's until the window ends. A store that fails
ends the turn (a spend cap fails closed, unless the store's ``on_error`` says
``"open"``).
"""

from __future__ import annotations

import logging
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, cast

import attrs
from opentelemetry import trace

from guardstack.guards._accounts import Accounts, StoreDown, check_ledger_store
from guardstack.guards.usage_costs import PRICE_FORM, ObservedOutputs, Price, cost_of, read_prices
from guardstack.pipeline.contract import (
    Model,
    ModelNext,
    ModelReply,
    ModelRequest,
    Registration,
    Reservation,
    Scope,
    StateStore,
    Usage,
    Window,
    calendar_periods,
    input_estimate,
    key_parts,
    never_reached,
    stated_output_limit,
    store_key,
)
from guardstack.pipeline.errors import ConfigError, GuardstackWarning, TurnBlocked
from guardstack.pipeline.signals import USAGE_USD, Shadow
from guardstack.pipeline.validate import cut, flag, invalid, number, optional_integer

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["UsageLimit"]

logger = logging.getLogger("guardstack")

PLUGIN: Final = "usage-limit"


def _check_usd(_: Any, __: Any, value: Any) -> None:
    if value is not None and number(PLUGIN, "usd_per_session", value) <= 0:
        raise invalid(PLUGIN, "usd_per_session", value, "a positive number of dollars")


def _check_tenant(_: Any, __: Any, value: Any) -> None:
    if value is not None and not callable(value) and not (isinstance(value, str) and value):
        raise invalid(PLUGIN, "tenant", value, "a name, a function of the model request, or None")


def _check_warn_at(_: Any, __: Any, value: Any) -> None:
    if value is not None and not (0 < number(PLUGIN, "warn_at", value) < 1):
        raise invalid(PLUGIN, "warn_at", value, "a fraction between 0 and 1")


def _check_estimate(_: Any, __: Any, value: Any) -> None:
    if value not in ("auto", "max", "observed"):
        raise invalid(PLUGIN, "estimate", value, "'auto', 'max' or 'observed'")


def _downgrade(value: object) -> Mapping[str, Any] | None:
    """``{"at": FRACTION, "to": MODEL}``: ``at`` in (0, 1], ``to`` a ``Model`` or a name."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"at", "to"}:
        raise invalid(PLUGIN, "downgrade", value, '{"at": a fraction, "to": a model or its name}')
    at, to = value["at"], value["to"]
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 < at <= 1:
        raise invalid(PLUGIN, "downgrade.at", at, "a fraction of the limit, in (0, 1]")
    if not (isinstance(to, str) and to) and not callable(getattr(to, "complete", None)):
        raise invalid(PLUGIN, "downgrade.to", to, "a Model, or the name of one")
    return {"at": float(at), "to": to}


@attrs.frozen
class UsageLimit:
    """Caps on tokens and dollars per turn, per session and per calendar window."""

    name: ClassVar[str] = PLUGIN

    tokens_per_turn: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "tokens_per_turn")
    )
    tokens_per_session: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "tokens_per_session")
    )
    usd_per_session: float | None = attrs.field(default=None, validator=_check_usd)
    prices: Mapping[str, Price] | None = attrs.field(default=None, converter=read_prices)
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
    #: How a call's output is reserved: ``max`` (its ``max_tokens``: a limit never
    #: passed by what calls at once reserved), ``observed`` (the 95th percentile of
    #: the last answers of that model and tenant, never above ``max_tokens``, and
    #: ``max_tokens`` until 20 were seen — see ``ObservedOutputs``) or ``auto``:
    #: ``observed`` for an agent whose ``max_tokens`` says nothing of its answers (the
    #: model proxy's: Claude Code asks 32,000 every time), ``max`` otherwise.
    estimate: Literal["auto", "max", "observed"] = attrs.field(
        default="auto", kw_only=True, validator=_check_estimate
    )
    #: Where the spend is kept (``None``: the harness's store).
    store: StateStore | None = attrs.field(
        default=None, kw_only=True, repr=False, validator=check_ledger_store(PLUGIN)
    )
    #: Count as usual, record what it would have refused, refuse nothing.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)
    #: ``{"at": 0.8, "to": MODEL}``: past that fraction of any window, the model stage
    #: switches to the cheaper model (a ``Model``, or a name the answering model can
    #: switch to with ``with_model``) instead of stopping at the limit.
    downgrade: Mapping[str, Any] | None = attrs.field(
        default=None, kw_only=True, converter=_downgrade
    )

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
        if self.prices_needed and self.prices is None:
            raise invalid(
                PLUGIN,
                "prices",
                None,
                f"given with a dollar limit (model name -> {PRICE_FORM})",
            )

    @property
    def prices_needed(self) -> bool:
        """Whether a dollar limit is set (and so ``prices`` must be)."""
        return any(
            limit is not None
            for limit in (self.usd_per_session, self.usd_per_day, self.usd_per_month)
        )

    def price(
        self, model: str | None, fallback: str | None, warned: set[str] | None = None
    ) -> Price:
        """The prices for a reply's model (else the requested one): input, output, cache
        reads, cache writes per million tokens. None of those priced: the highest price
        known — a bound, not a guess, and what the call was reserved at — with a
        warning, once per model in ``warned`` (an application's)."""
        prices = self.prices or {}
        for name in (model, fallback):
            if name is not None and name in prices:
                return prices[name]
        unpriced = model or fallback
        warned = warned if warned is not None else set()
        if unpriced is not None and unpriced not in warned:
            warned.add(unpriced)
            known = ", ".join(sorted(prices)) or "none"
            logger.warning(
                "%s: no price for model %r (known: %s): charged at the highest price in "
                "`prices`; add it there",
                PLUGIN,
                unpriced,
                known,
            )
        return self.highest_price()

    def highest_price(self) -> Price:
        """Each of the four prices at its highest across ``prices``: what a call whose
        model is not known yet reserves at, so the bound holds whichever it is."""
        table = list((self.prices or {}).values()) or [(0.0, 0.0, 0.0, 0.0)]
        return tuple(max(price[i] for price in table) for i in range(4))  # type: ignore[return-value]

    def cost_usd(
        self,
        usage: Usage,
        model: str | None,
        fallback: str | None,
        warned: set[str] | None = None,
    ) -> float:
        """What ``usage`` cost at the model's price."""
        return cost_of(usage, self.price(model, fallback, warned))

    def reserve_for(
        self, request: ModelRequest, asked_for: str | None, observed: int | None = None
    ) -> dict[str, float]:
        """What a call reserves before it is made: its input (a token per four characters
        of the request, the stated rule) and its output (the answering model's
        ``max_tokens``, else ``estimate_output_tokens``; with ``estimate: observed``
        what that model's answers used, ``observed``, when it is smaller), in tokens
        and, at the model's price (the highest known when it names none that is
        priced), in dollars."""
        input_tokens = input_estimate(request.messages)
        answering = _answering(request)
        output = stated_output_limit(answering) or self.estimate_output_tokens
        observing = self.estimate == "observed" or (
            self.estimate == "auto" and getattr(answering, "observed_estimates", False) is True
        )
        if observed is not None and observing:
            output = min(output, observed)
        usd = 0.0
        if self.prices is not None and self.prices_needed:
            prices = self.prices
            price = (
                prices[asked_for]
                if asked_for is not None and asked_for in prices
                else self.highest_price()
            )
            usd = cost_of(Usage(input_tokens, output), price)
        return {"usd": usd, "tokens": float(input_tokens + output)}

    def apply(self, scope: Scope) -> None:
        """Register the reserving model-call layer; its turn windows close as turns end."""
        _Limits(self, scope).register(scope)


def _cheaper_model(to: object, answering: object) -> object:
    """The model a downgrade sends calls to: ``to`` itself, or the answering model
    switched to the name ``to`` (``with_model``)."""
    if not isinstance(to, str):
        return to
    switch = getattr(answering, "with_model", None)
    if not callable(switch):
        raise ConfigError(
            f"{PLUGIN}: downgrade.to names the model {to!r}, but {cut(answering)} cannot switch "
            "to another model (it has no with_model); give a Model instead",
            plugin=PLUGIN,
            key="downgrade.to",
            value=to,
        )
    return switch(to)


def _answering(request: ModelRequest) -> object:
    """The model that answers a request (a child's own, for a call charged to its parent)."""
    return request.model if request.model is not None else request.agent.model


def _model_name(model: object) -> str | None:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


class _Limits:
    """One application: its accounts, the windows of each call, the layer."""

    def __init__(self, config: UsageLimit, scope: Scope) -> None:
        self.config = config
        #: The models charged without a price of their own (each warned of once).
        self.unpriced: set[str] = set()
        #: Recent output sizes by (model, tenant), for ``estimate: observed``.
        self.outputs = ObservedOutputs()
        self.accounts = Accounts(scope, config.store)
        self.signals = scope.signals
        self.shadow = Shadow(scope.namespace, scope.signals) if config.shadow else None
        #: Agents whose calls go to the downgrade's model now (for ``BudgetNotice``).
        self.downgraded: weakref.WeakKeyDictionary[Agent, str] = weakref.WeakKeyDictionary()
        self.wall_clock: Callable[[], float] = getattr(
            self.accounts.ledger, "wall_clock", time.time
        )
        #: The least each agent's session has cost: its log's replies when first seen,
        #: plus what this process settled since (the session window's floor).
        self.costs: weakref.WeakKeyDictionary[Agent, float] = weakref.WeakKeyDictionary()
        self.calendar = [
            (kind, period, limit)
            for kind, period, limit in (
                ("usd", "day", config.usd_per_day),
                ("usd", "month", config.usd_per_month),
                ("tokens", "day", config.tokens_per_day),
            )
            if limit is not None
        ]

    def register(self, scope: Scope) -> None:
        scope.use(scope.loop.model_call, self.layer, name=PLUGIN)
        self.accounts.close_turns(
            scope, lambda token: [self.accounts.turn_window(token, "tokens", "tokens", None).key]
        )
        scope.adopt(scope.loop.tree.report_remaining(self.remaining))
        if self.config.tenant is not None:  # the usage metric names the same tenant
            loop = scope.loop
            loop.tenant_of = self.metric_tenant

            def forget() -> None:
                if loop.tenant_of == self.metric_tenant:
                    loop.tenant_of = None

            scope.adopt(Registration(forget))

    def metric_tenant(self, agent: Agent, request: ModelRequest | None) -> str | None:
        """The tenant a call's usage metric names: this cap's, as its spend metric does."""
        return self.tenant_of(request, agent, "default")

    def tenant_of(self, request: ModelRequest | None, agent: Agent, otherwise: str) -> str:
        """Whose windows (and spend metric) a call counts in."""
        tenant = self.config.tenant
        if callable(tenant):
            return str(tenant(request)) if request is not None else otherwise
        return tenant or getattr(agent, "tenant", None) or otherwise

    def logged_cost(self, agent: Agent) -> float:
        cost = self.costs.get(agent)
        if cost is None:
            cost = 0.0
            for event in agent.session.events:
                usage = getattr(event, "usage", None)
                if event.type == "assistant/message" and usage is not None:
                    model = getattr(event, "model", None)
                    cost += self.config.cost_usd(
                        usage, model, _model_name(agent.model), self.unpriced
                    )
            self.costs[agent] = cost
        return cost

    def windows(self, agent: Agent, request: ModelRequest | None) -> list[Window]:
        config, accounts = self.config, self.accounts
        found = []
        if config.tokens_per_turn is not None:
            found.append(
                accounts.turn_window(
                    accounts.turn_of(agent),
                    "tokens",
                    "tokens",
                    config.tokens_per_turn,
                    agent.turn_usage.total_tokens,
                )
            )
        session = agent.session_id
        if config.tokens_per_session is not None:
            found.append(
                accounts.session_window(
                    session, "tokens", "tokens", config.tokens_per_session, agent.usage.total_tokens
                )
            )
        if config.usd_per_session is not None:
            found.append(
                accounts.session_window(
                    session, "usd", "usd", config.usd_per_session, self.logged_cost(agent)
                )
            )
        if self.calendar and (request is not None or not callable(config.tenant)):
            tenant = self.tenant_of(request, agent, "all")
            periods = calendar_periods(self.wall_clock())
            for kind, period, limit in self.calendar:
                name, ttl_s = periods[period]
                found.append(
                    accounts.tenant_window(tenant, kind, f"{period}:{name}", kind, limit, ttl_s)
                )
        return found

    def refusal(self, reservation: Reservation, estimate: dict[str, float]) -> str:
        window = reservation.window
        assert window is not None
        assert window.limit is not None
        used, limit = reservation.used, window.limit
        parts = key_parts(window.key)
        dollars = window.unit == "usd"
        amount = f"${used:.4f}" if dollars else f"{used:g} tokens"
        bound = f"${limit:.4f}" if dollars else f"{limit:g} tokens"
        if parts[1] == "tenant":
            period = parts[4].split(":")[0]
            reason = (
                f"{PLUGIN}: tenant {parts[2]!r} has used {amount} this {period} and the "
                f"limit is {bound} per {period}"
            )
        elif parts[1] == "turn":
            reason = f"{PLUGIN}: this turn used {used:g} tokens and the limit is {limit:g} per turn"
        elif dollars:
            reason = (
                f"{PLUGIN}: this session cost ${used:.4f} and the limit is ${limit:.4f} per session"
            )
        else:
            reason = (
                f"{PLUGIN}: this session used {used:g} tokens and the limit is "
                f"{limit:g} per session"
            )
        if used < limit:
            wanted = estimate[window.unit]
            reserved = f"${wanted:.4f}" if dollars else f"{wanted:g} tokens"
            reason += f" (this call's reservation of {reserved} would pass it)"
        return reason

    async def layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        config, accounts = self.config, self.accounts
        agent = request.agent
        windows = self.windows(agent, request)
        if config.downgrade is not None:
            request = await self.maybe_downgraded(request, windows)
        asked_for = _model_name(_answering(request))
        observed_key = (asked_for or "", self.tenant_of(request, agent, "default"))
        estimate = config.reserve_for(request, asked_for, self.outputs.estimate(observed_key))
        op_id = accounts.operation()
        try:
            reservation = await accounts.reserve(op_id, estimate, windows)
        except StoreDown as down:
            if not accounts.fails_open:
                raise TurnBlocked(
                    f"{PLUGIN}: its {accounts.ledger.name} store is not answering "
                    f"({type(down.error).__name__}); no model call is made without it"
                ) from down.error
            logger.warning("%s: the store is down; a call goes through uncounted", PLUGIN)
            return await call_next(request)
        if not reservation.granted:
            reason = self.refusal(reservation, estimate)
            if self.shadow is None:
                raise TurnBlocked(reason)
            self.shadow.would("end the turn", f"agent {agent.session_id}", reason)
            return await call_next(request)  # uncounted, as a refused call is
        try:
            reply = await call_next(request)
        except BaseException as error:
            if never_reached(error):
                await accounts.release(op_id)
            else:
                await accounts.settle(op_id, {})  # it may have been billed: its reservation
            raise
        await self.settle(op_id, request, reply, asked_for, windows)
        return reply

    async def maybe_downgraded(self, request: ModelRequest, windows: list[Window]) -> ModelRequest:
        """The request, sent to the cheaper model once any window is past the downgrade's
        fraction of its limit (logged, an event, the chat span's attributes)."""
        downgrade = self.config.downgrade
        assert downgrade is not None
        at = float(downgrade["at"])
        try:
            past = [
                window
                for window in windows
                if window.limit and await self.accounts.balance(window) >= at * window.limit
            ]
        except Exception:
            return request  # a store that does not answer decides nothing here
        agent = request.agent
        if not past:
            self.downgraded.pop(agent, None)
            return request
        cheaper = _cheaper_model(downgrade["to"], _answering(request))
        name = _model_name(cheaper) or repr(cheaper)
        if self.downgraded.get(agent) != name:
            self.downgraded[agent] = name
            window = past[0]
            share = round(at * 100)
            logger.info("%s: past %d%% of %s: %s answers now", PLUGIN, share, window.key, name)
            self.signals.event(
                "guardstack.downgrade",
                {"guardstack.window": window.key, "gen_ai.request.model": name, "at": at},
                "WARN",
            )
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("gen_ai.request.model", name)
            span.set_attribute("guardstack.downgraded", True)
        return attrs.evolve(request, model=cast(Model, cheaper))

    async def settle(
        self,
        op_id: str,
        request: ModelRequest,
        reply: ModelReply,
        asked_for: str | None,
        windows: list[Window],
    ) -> None:
        config, accounts, agent = self.config, self.accounts, request.agent
        usage = reply.usage if isinstance(reply, ModelReply) else None
        if usage is None:  # unknown usage: charged its reservation
            await accounts.settle(op_id, {})
            return
        actual = {"tokens": float(usage.total_tokens)}
        self.outputs.seen((asked_for or "", self.tenant_of(request, agent, "default")),
                          usage.output_tokens)  # fmt: skip
        try:
            if config.prices is not None:
                cost = config.cost_usd(usage, reply.model, asked_for, self.unpriced)
                actual["usd"] = cost
                tenant = self.tenant_of(request, agent, "default")
                self.signals.add(USAGE_USD, cost, {"tenant": tenant})
                if agent in self.costs:
                    self.costs[agent] += cost
        finally:
            await accounts.settle(op_id, actual)  # a price missing: dollars stay reserved
        if config.warn_at is not None:
            await self.warn(windows, request)

    async def warn(self, windows: list[Window], request: ModelRequest) -> None:
        warn_at = self.config.warn_at
        assert warn_at is not None
        for window in windows:
            parts = key_parts(window.key)
            if parts[1] != "tenant" or window.limit is None:
                continue
            try:
                total = await self.accounts.balance(window)
                if total < warn_at * window.limit:
                    continue
                ledger = self.accounts.ledger
                first, _ = await ledger.add(store_key(*parts, "warned"), 1, limit=1)
            except Exception:
                logger.debug("%s: could not read a window for its warning", PLUGIN, exc_info=True)
                continue
            if first:
                period = parts[4].split(":")[0]
                warnings.warn(
                    f"{PLUGIN}: tenant {parts[2]!r} has used {total:g} of its "
                    f"{window.limit:g} {window.unit} this {period} ({warn_at:.0%} warning)",
                    GuardstackWarning,
                    stacklevel=2,
                )

    async def remaining(self, agent: Agent) -> dict[str, float]:
        """What is left of every limit that applies (for ``BudgetNotice``; ``downgraded``
        when its calls go to the cheaper model)."""
        left: dict[str, list[float]] = {"tokens": [], "usd": []}
        if agent in self.downgraded:
            left["downgraded"] = [1.0]
        try:
            for window in self.windows(agent, None):
                assert window.limit is not None
                left[window.unit].append(window.limit - await self.accounts.balance(window))
        except Exception:
            logger.debug("%s: could not read what is left", PLUGIN, exc_info=True)
        return {unit: max(0.0, min(amounts)) for unit, amounts in left.items() if amounts}
