"""What a usage limit's refusal says: whose window, how much was used, the limit."""

from __future__ import annotations

from typing import Final

from guardstack.pipeline.contract import Reservation, key_parts

__all__ = ["refusal"]

PLUGIN: Final = "usage-limit"


def refusal(reservation: Reservation, estimate: dict[str, float]) -> str:
    """The reason a refused reservation ends the turn, naming the window it hit."""
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
            f"{PLUGIN}: this session used {used:g} tokens and the limit is {limit:g} per session"
        )
    if used < limit:
        wanted = estimate[window.unit]
        reserved = f"${wanted:.4f}" if dollars else f"{wanted:g} tokens"
        reason += f" (this call's reservation of {reserved} would pass it)"
    return reason
