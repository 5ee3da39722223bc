"""Wrap up instead of a hard stop: what the caps that say ``on_limit: wrap_up`` share.

A cap that would end the turn sends its request once more instead — its tools
withheld, a note asking the model to say what it did, what is left and what the
person should do next — and ends the turn with that answer (``TurnResult.reason``
``"blocked"``, ``TurnResult.text`` the answer, ``TurnResult.error`` the limit). The
call is paid for out of an allowance the cap keeps aside: ``ModelCallLimit`` one call,
``UsageLimit`` ``wrap_up_tokens`` of output (default 1,000) at the highest output
price it knows, so a cap that wraps up still never passes its limit. A turn wraps up
once; past the allowance the cap stops as it always did.

Behind the model proxy a budget's ``on_limit: wrap_up`` does the same with the
client's own request (its tools fields left out, ``max_tokens`` set to the allowance).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, NoReturn, TypeAlias

import attrs

from guardstack.pipeline.contract import ModelNext, ModelRequest
from guardstack.pipeline.errors import TurnBlocked
from guardstack.pipeline.validate import invalid

__all__ = [
    "WRAP_UP_TOKENS",
    "OnLimit",
    "check_on_limit",
    "kept_aside_usd",
    "last_request",
    "wrap_up",
    "wrap_up_note",
]

#: What a cap does at its limit: end the turn (``stop``), or first ask for a last answer.
OnLimit: TypeAlias = Literal["stop", "wrap_up"]

#: The output a wrap-up answer may use, unless the cap says otherwise.
WRAP_UP_TOKENS: Final = 1_000


def check_on_limit(plugin: str) -> Callable[[Any, Any, Any], None]:
    """An attrs validator of a cap's ``on_limit``."""

    def check(_: object, __: object, value: object) -> None:
        if value not in ("stop", "wrap_up"):
            raise invalid(plugin, "on_limit", value, "'stop' or 'wrap_up'")

    return check


def wrap_up_note(reason: str) -> str:
    """What the model is told in its last request."""
    return (
        f"The budget for this work is used up ({reason}). Do not call tools. In a few "
        "sentences, say what you did, what is left to do, and what the person should do next."
    )


def last_request(request: ModelRequest, note: str) -> ModelRequest:
    """The request sent once more: the note after its messages, no tools offered."""
    return attrs.evolve(
        request, messages=[*request.messages, {"role": "user", "content": note}], tools=[]
    )


async def wrap_up(request: ModelRequest, call_next: ModelNext, reason: str) -> NoReturn:
    """Send ``request`` as the turn's last, then end the turn with its answer."""
    note = wrap_up_note(reason)
    answer = await call_next(last_request(request, note))
    raise TurnBlocked(reason, answer=answer, note=note)


def kept_aside_usd(tokens: int, prices: Mapping[str, Sequence[float]] | None) -> float:
    """What a wrap-up answer of ``tokens`` may cost: at the highest output price known."""
    highest = max((float(price[1]) for price in (prices or {}).values()), default=0.0)
    return tokens * highest / 1_000_000
