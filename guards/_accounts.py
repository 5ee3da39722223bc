"""What the caps share: their accounts in the ledger, and the rule for each outcome.

Every cap (``ToolCallLimit``, ``ModelCallLimit``, ``UsageLimit``) counts through the
store's ``Ledger`` (``pipeline/ledger.py``): before a call it *reserves* its estimate
in every window that applies — all or none, so concurrent calls cannot walk through a
limit together — and after it *settles* what was really spent, or *releases* the
reservation when the call never reached what it pays for. The rule, in one place:

* a reply (or a tool call that ran): settled at what it reports;
* guardstack's own control flow — another layer's refusal, a cap's ``TurnBlocked`` — or
  a provider's clear "no" before any work (``MODEL_RATE_LIMITED``, ``MODEL_OVERLOADED``,
  ``MODEL_REJECTED``): released;
* anything that may have reached the provider — a cancelled caller, a timeout, a lost
  reply, a 5xx — charged its reservation (never less unless usage arrives saying so).

Window lifetimes follow their meaning: a turn's windows are closed when the turn ends
(a day at most, for a conversation outside the agent loop, whose turns no loop ends);
a session's live ``store.session_ttl_s`` after their last use and are floored at what
the session log holds; a calendar window lives until it ends.

A store that fails leaves each cap to its policy (closed by default: no call is made
without its count); a reservation whose answer was lost is released by its id, so a
refused call never stays counted.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from guardstack.guards.agent_state import new_turn_token
from guardstack.pipeline.contract import (
    Reservation,
    Scope,
    StoreLedger,
    Window,
    store_key,
)
from guardstack.pipeline.errors import GuardstackError
from guardstack.pipeline.ledger import DAY_S, SESSION_TTL_S

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["Accounts", "StoreDown", "check_ledger_store"]

logger = logging.getLogger("guardstack")


class StoreDown(Exception):
    """The ledger did not answer a reservation (the cap's failure policy decides)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def check_ledger_store(plugin: str) -> Callable[[Any, Any, Any], None]:
    """``store=``: ``None`` (the harness's) or a store that keeps a ledger."""
    from guardstack.pipeline.contract import Ledger, StateStore
    from guardstack.pipeline.validate import invalid

    def check(_: object, __: object, value: object) -> None:
        if value is not None and not (isinstance(value, StateStore) and isinstance(value, Ledger)):
            raise invalid(
                plugin,
                "store",
                value,
                "a store that keeps a ledger (MemoryStore, RedisStore) or None",
            )

    return check


class Accounts:
    """One cap application's accounts in a ledger: windows, operations, turn ends."""

    __slots__ = (
        "_operation",
        "_turn_keys",
        "_turns",
        "ledger",
        "namespace",
        "policy",
        "session_ttl_s",
        "shield",
    )

    def __init__(self, scope: Scope, store: object | None) -> None:
        self.ledger: StoreLedger = scope.ledger_for(store)  # type: ignore[arg-type]
        self.namespace = scope.namespace
        self.policy = self.ledger.on_error
        #: A store that suspends (a remote one) has its settlements shielded from a
        #: caller's cancellation; one that answers at once needs no shield.
        self.shield = bool(getattr(self.ledger, "suspends", True))
        self._operation = store_key(self.namespace, "op") + ":"  # tokens need no escaping
        self._turn_keys = store_key(self.namespace, "turn") + ":"
        self.session_ttl_s = float(getattr(self.ledger, "session_ttl_s", SESSION_TTL_S))
        #: Each agent's current turn token (a new one each person's prompt).
        self._turns: weakref.WeakKeyDictionary[Agent, str] = weakref.WeakKeyDictionary()

    @property
    def fails_open(self) -> bool:
        return self.policy == "open"

    # -- keys ----------------------------------------------------------------------------

    def operation(self) -> str:
        """A new operation's id: unique across turns and processes."""
        return self._operation + new_turn_token()

    def turn_of(self, agent: Agent) -> str:
        """The token of the agent's current turn (made at its first use)."""
        token = self._turns.get(agent)
        if token is None:
            token = self._turns[agent] = new_turn_token()
        return token

    def turn_window(
        self, token: str, counter: str, unit: str, limit: float | None, floor: float = 0.0
    ) -> Window:
        key = self._turn_keys + token + ":" + store_key(counter)  # a token is hex: plain
        return Window(key, unit, limit, DAY_S, floor)

    def session_window(
        self, session_id: str, counter: str, unit: str, limit: float | None, floor: float = 0.0
    ) -> Window:
        key = store_key(self.namespace, "session", session_id, counter)
        return Window(key, unit, limit, self.session_ttl_s, floor)

    def tenant_window(
        self, tenant: str, counter: str, period: str, unit: str, limit: float, ttl_s: float
    ) -> Window:
        key = store_key(self.namespace, "tenant", tenant, counter, period)
        return Window(key, unit, limit, ttl_s)

    # -- operations ----------------------------------------------------------------------

    async def reserve(
        self,
        op_id: str,
        amounts: Mapping[str, float],
        windows: Sequence[Window],
        *,
        lease_s: float | None = None,
    ) -> Reservation:
        """Reserve, or raise ``StoreDown`` (the reservation, if it happened, released)."""
        try:
            return await self.ledger.reserve(op_id, amounts, windows, lease_s=lease_s)
        except GuardstackError:
            raise
        except Exception as error:
            await self.release(op_id)  # a lost reply may have reserved: never keep it
            raise StoreDown(error) from error
        except BaseException:
            await self.release(op_id)
            raise

    async def settle(self, op_id: str, actual: Mapping[str, float]) -> None:
        """Settle (shielded, on a store that suspends: a cancelled caller's call is still
        accounted for)."""
        if not self.shield:
            await self._settle(op_id, actual)
            return
        with anyio.CancelScope(shield=True):
            await self._settle(op_id, actual)

    async def _settle(self, op_id: str, actual: Mapping[str, float]) -> None:
        try:
            await self.ledger.settle(op_id, actual)
        except GuardstackError:
            raise
        except Exception:
            logger.warning(
                "%s: the %s store did not settle a reservation (it stays charged in full)",
                self.namespace,
                self.ledger.name,
                exc_info=True,
            )

    async def release(self, op_id: str) -> None:
        """Give a reservation back (shielded, on a store that suspends)."""
        if not self.shield:
            await self._release(op_id)
            return
        with anyio.CancelScope(shield=True):
            await self._release(op_id)

    async def _release(self, op_id: str) -> None:
        try:
            await self.ledger.release(op_id)
        except GuardstackError:
            raise
        except Exception:
            logger.warning(
                "%s: the %s store did not release a reservation now (it will at the "
                "next contact, or stays charged)",
                self.namespace,
                self.ledger.name,
                exc_info=True,
            )

    async def charged(self, op_id: str, amounts: Mapping[str, float]) -> None:
        """An operation whose reservation is its charge (a call counts one) is done. On a
        store that answers at once it is settled (its record goes); on a remote one
        nothing is sent — the reservation stands, and its record expires with the lease
        it was made with — so a counted call costs one round trip."""
        if not self.shield:  # the settlement inline: the usual path has no frame to spare
            try:
                await self.ledger.settle(op_id, amounts)
            except GuardstackError:
                raise
            except Exception:
                logger.warning("%s: a settlement failed", self.namespace, exc_info=True)

    async def balance(self, window: Window) -> float:
        return await self.ledger.balance(window)

    # -- turn ends -----------------------------------------------------------------------

    def close_turns(self, scope: Scope, counters: Callable[[str], Sequence[str]]) -> None:
        """When an agent's turn ends (not a pause for approval), close its windows:
        ``counters(token)`` names their keys. Each person's prompt starts a new token."""
        turns = self._turns
        ledger = self.ledger

        async def ended(agent: Agent) -> None:
            token = turns.pop(agent, None)
            if token is not None:
                try:
                    await ledger.close(counters(token))
                except Exception:
                    logger.debug("could not close a turn's windows", exc_info=True)

        async def new_turn(
            agent: Agent, text: str, call_next: Callable[[Agent, str], Awaitable[str]]
        ) -> str:
            turns[agent] = new_turn_token()
            return await call_next(agent, text)

        scope.adopt(scope.loop.on_turn_end(ended))
        scope.use(scope.loop.prompt_submit, new_turn, name=scope.plugin_id)
