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

``on_limit="wrap_up"`` keeps ``wrap_up_tokens`` (default 1,000) of every limit aside —
priced, in a dollar limit, at the highest output price — and the call refused by the
rest goes once more with its tools withheld and a note asking the model what it did
and what is left; the turn ends ``blocked`` with that answer as its text
(``guards.wrap_up``). Each limit still holds: the last call is reserved against it.

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
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, NoReturn

import attrs

from guardstack.guards._accounts import Accounts, StoreDown, check_ledger_store
from guardstack.guards.usage_costs import PRICE_FORM, ObservedOutputs, Price, cost_of, read_prices
from guardstack.guards.usage_downgrade import Downgrades, answering, model_name, read_downgrade
from guardstack.guards.usage_windows import refusal
from guardstack.guards.wrap_up import (
    WRAP_UP_TOKENS,
    OnLimit,
    check_on_limit,
    kept_aside_usd,
    last_request,
    wrap_up,
    wrap_up_note,
)
from guardstack.pipeline.contract import (
    ModelNext,
    ModelReply,
    ModelRequest,
    Registration,
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
from guardstack.pipeline.errors import GuardstackWarning, TurnBlocked
from guardstack.pipeline.model_members import observes_estimates, stated_input_tokens
from guardstack.pipeline.signals import USAGE_USD, Shadow
from guardstack.pipeline.validate import flag, invalid, number, optional_integer

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
        default=None, kw_only=True, converter=read_downgrade
    )
    #: At a limit: end the turn (``stop``), or first send the call once more without
    #: tools for a last answer, out of ``wrap_up_tokens`` kept aside (``wrap_up``).
    on_limit: OnLimit = attrs.field(default="stop", validator=check_on_limit(PLUGIN), kw_only=True)
    wrap_up_tokens: int = attrs.field(
        default=WRAP_UP_TOKENS, kw_only=True, validator=optional_integer(PLUGIN, "wrap_up_tokens")
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
        self,
        request: ModelRequest,
        asked_for: str | None,
        observed: int | None = None,
        *,
        output_tokens: int | None = None,
    ) -> dict[str, float]:
        """What a call reserves before it is made: its input (what the model counts of its
        own request, else a token per four characters of the request, the stated rule)
        and its output (the answering model's ``max_tokens``, else
        ``estimate_output_tokens``; with ``estimate: observed`` what that model's answers
        used, ``observed``, when it is smaller; a wrap-up's ``output_tokens``), in tokens
        and, at the model's price (the highest known when
        it names none that is priced), in dollars."""
        model = answering(request)
        # a model that counts its own request's input (the model proxy's, by its wire:
        # system prompts, parts, tool definitions) is read; else the stated rule
        input_tokens = stated_input_tokens(model) or input_estimate(request.messages)
        output = output_tokens or stated_output_limit(model) or self.estimate_output_tokens
        observing = output_tokens is None and (
            self.estimate == "observed" or (self.estimate == "auto" and observes_estimates(model))
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
        self.downgrades = (
            None
            if config.downgrade is None
            else Downgrades(config.downgrade, self.accounts, scope.signals)
        )
        #: What each unit's limits keep aside for a wrap-up answer.
        self.aside = (
            {
                "tokens": float(config.wrap_up_tokens),
                "usd": kept_aside_usd(config.wrap_up_tokens, config.prices),
            }
            if config.on_limit == "wrap_up"
            else {}
        )
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
                        usage, model, model_name(agent.model), self.unpriced
                    )
            self.costs[agent] = cost
        return cost

    def windows(
        self, agent: Agent, request: ModelRequest | None, *, wrap_up: bool = False
    ) -> list[Window]:
        """A call's windows: each limit less what it keeps aside, unless it wraps up."""
        found = self._windows(agent, request)
        aside = self.aside
        if not aside or wrap_up:
            return found
        return [
            attrs.evolve(window, limit=max(0.0, window.limit - aside[window.unit]))
            if window.limit is not None
            else window
            for window in found
        ]

    def _windows(self, agent: Agent, request: ModelRequest | None) -> list[Window]:
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

    async def layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        config, accounts = self.config, self.accounts
        agent = request.agent
        windows = self.windows(agent, request)
        if self.downgrades is not None:
            request = await self.downgrades.request(request, windows)
        asked_for = model_name(answering(request))
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
            reason = refusal(reservation, estimate)
            if self.shadow is not None:
                self.shadow.would("end the turn", f"agent {agent.session_id}", reason)
                return await call_next(request)  # uncounted, as a refused call is
            if not self.aside:
                raise TurnBlocked(reason)
            await self.wrap_up(request, call_next, asked_for, reason)
        return await self.settled(op_id, request, call_next, asked_for, windows)

    async def wrap_up(
        self, request: ModelRequest, call_next: ModelNext, asked_for: str | None, reason: str
    ) -> NoReturn:
        """The refused call sent once more without tools, out of what the limits keep
        aside — if that covers it; the turn ends either way."""
        last = last_request(request, wrap_up_note(reason))
        windows = self.windows(request.agent, request, wrap_up=True)
        estimate = self.config.reserve_for(
            last, asked_for, output_tokens=self.config.wrap_up_tokens
        )
        op_id = self.accounts.operation()
        try:
            kept = await self.accounts.reserve(op_id, estimate, windows)
        except StoreDown as down:
            raise TurnBlocked(reason) from down.error
        if not kept.granted:
            raise TurnBlocked(reason)

        async def reserved(request: ModelRequest) -> ModelReply:
            return await self.settled(op_id, request, call_next, asked_for, windows)

        await wrap_up(request, reserved, reason)

    async def settled(
        self,
        op_id: str,
        request: ModelRequest,
        call_next: ModelNext,
        asked_for: str | None,
        windows: list[Window],
    ) -> ModelReply:
        """The reserved call made, and settled at what its reply reports."""
        accounts = self.accounts
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
        if self.downgrades is not None and agent in self.downgrades.downgraded:
            left["downgraded"] = [1.0]
        try:
            for window in self.windows(agent, None):
                assert window.limit is not None
                left[window.unit].append(window.limit - await self.accounts.balance(window))
        except Exception:
            logger.debug("%s: could not read what is left", PLUGIN, exc_info=True)
        return {unit: max(0.0, min(amounts)) for unit, amounts in left.items() if amounts}
