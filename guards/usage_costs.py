"""What a model call costs and what it reserves, for ``UsageLimit``.

* **Prices**: model name -> ``(usd per million input, output[, cache reads, cache
  writes])``, checked as ``UsageLimit(prices=…)`` is built; ``cost_of`` prices a usage.
* **Observed outputs** (``estimate: observed``): what recent answers of each model
  and tenant used, so a call whose ``max_tokens`` says little of its answer reserves
  what such answers use, with a stated overshoot bound.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Final

from guardstack.pipeline.contract import Usage
from guardstack.pipeline.validate import invalid, number

__all__ = ["PRICE_FORM", "ObservedOutputs", "Price", "cost_of", "read_prices"]

PLUGIN: Final = "usage-limit"
Price = tuple[float, float, float, float]
PRICE_FORM = "[usd per million input, output] (then cache reads, cache writes)"


def read_prices(value: object) -> dict[str, Price] | None:
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


def cost_of(usage: Usage, price: Price) -> float:
    per_input, per_output, per_read, per_write = price
    plain = max(0, usage.input_tokens - usage.cached_input_tokens - usage.cache_write_tokens)
    return (
        plain * per_input
        + usage.cached_input_tokens * per_read
        + usage.cache_write_tokens * per_write
        + usage.output_tokens * per_output
    ) / 1_000_000


class ObservedOutputs:
    """What recent answers of each model and tenant used: ``estimate: observed``.

    A real agent asks for a far larger ``max_tokens`` than its answers use (Claude Code
    asks 32,000 on every request; its answers use a few hundred), and a reservation of
    the maximum uses a budget up thirty times faster than the spend. So a call
    reserves, for its output: ``max_tokens`` until ``SEEN_FIRST`` answers of the same
    model and tenant were seen; then twice the largest of them, until ``SEEN_ENOUGH``
    were (a percentile of a handful is a guess); then the ``PERCENTILE`` of the last
    ``KEPT`` — never above ``max_tokens``.

    The price of it, the overshoot bound: a call whose answer uses more than its
    estimate settles above it, so calls that ran at once may pass a limit by at most
    the sum of their (``max_tokens`` - estimate) tokens of output, at the output
    price; one call alone passes it by at most its own. With ``estimate: max``, by
    nothing."""

    KEPT: Final = 200
    SEEN_FIRST: Final = 3
    SEEN_ENOUGH: Final = 20
    PERCENTILE: Final = 0.95

    def __init__(self) -> None:
        self._sizes: dict[tuple[str, str], deque[int]] = {}

    def seen(self, key: tuple[str, str], output_tokens: int) -> None:
        sizes = self._sizes.get(key)
        if sizes is None:
            if len(self._sizes) > 10_000:  # many models and tenants: start again
                self._sizes.clear()
            sizes = self._sizes[key] = deque(maxlen=self.KEPT)
        sizes.append(max(0, int(output_tokens)))

    def estimate(self, key: tuple[str, str]) -> int | None:
        """What to reserve for the next answer, or ``None`` while too few were seen."""
        sizes = self._sizes.get(key)
        if sizes is None or len(sizes) < self.SEEN_FIRST:
            return None
        if len(sizes) < self.SEEN_ENOUGH:
            return max(1, 2 * max(sizes))
        ordered = sorted(sizes)
        rank = min(len(ordered) - 1, math.ceil(self.PERCENTILE * len(ordered)) - 1)
        return max(1, ordered[rank])
