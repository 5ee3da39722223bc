"""A usage limit's downgrade: past a fraction of any window, calls go to a cheaper model.

``UsageLimit(downgrade={"at": 0.8, "to": MODEL})``: once any of a call's windows holds
that fraction of its limit, the model stage sends the call to the cheaper model (a
``Model``, or a name the answering model switches to with ``with_model``) instead of
stopping at the limit — logged once per agent and model, an OpenTelemetry event, and
the chat span's ``gen_ai.request.model``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, cast

import attrs
from opentelemetry import trace

from guardstack.pipeline.contract import Model, ModelRequest, Window
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.model_members import model_name_of, switchable
from guardstack.pipeline.validate import cut, invalid

if TYPE_CHECKING:
    from guardstack.guards._accounts import Accounts
    from guardstack.pipeline.contract import Agent
    from guardstack.pipeline.signals import Signals

__all__ = ["Downgrades", "read_downgrade"]

logger = logging.getLogger("guardstack")

PLUGIN: Final = "usage-limit"


def read_downgrade(value: object) -> Mapping[str, Any] | None:
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


def answering(request: ModelRequest) -> object:
    """The model that answers a request (a child's own, for a call charged to its parent)."""
    return request.model if request.model is not None else request.agent.model


def model_name(model: object) -> str | None:
    """A model's name, when it has one."""
    return model_name_of(model)


def _cheaper_model(to: object, answering: object) -> object:
    """The model a downgrade sends calls to: ``to`` itself, or the answering model
    switched to the name ``to`` (``with_model``)."""
    if not isinstance(to, str):
        return to
    switch = switchable(answering)
    if switch is None:
        raise ConfigError(
            f"{PLUGIN}: downgrade.to names the model {to!r}, but {cut(answering)} cannot switch "
            "to another model (it has no with_model); give a Model instead",
            plugin=PLUGIN,
            key="downgrade.to",
            value=to,
        )
    return switch(to)


class Downgrades:
    """One application's downgrade: which agents' calls go to the cheaper model now."""

    def __init__(self, downgrade: Mapping[str, Any], accounts: Accounts, signals: Signals) -> None:
        self.downgrade = downgrade
        self.accounts = accounts
        self.signals = signals
        #: Agents whose calls go to the downgrade's model now (for ``BudgetNotice``).
        self.downgraded: weakref.WeakKeyDictionary[Agent, str] = weakref.WeakKeyDictionary()

    async def request(self, request: ModelRequest, windows: list[Window]) -> ModelRequest:
        """The request, sent to the cheaper model once any window is past the downgrade's
        fraction of its limit (logged, an event, the chat span's attributes)."""
        downgrade = self.downgrade
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
        cheaper = _cheaper_model(downgrade["to"], answering(request))
        name = model_name(cheaper) or repr(cheaper)
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
