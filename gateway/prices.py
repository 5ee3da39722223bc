"""Prices from a maintained table: what a model costs when no file prices it.

A tenants or guards file's ``prices`` win; a model they do not price is looked up in
the ``genai-prices`` package (its maintainers keep providers' prices current: a new
release, a new table — nothing is fetched at run time). Each lookup is made once a
model and provider and kept. The table's base tier is read (a request's first thousand
tokens of each kind), as the four per-million prices guardstack charges by: input,
output, cache reads, cache writes. A model the table does not know either is
``None``: the caller charges its fallback and names it once.
"""

from __future__ import annotations

import functools
import logging
from typing import Final

from guardstack.guards.usage_costs import Price

__all__ = ["PROVIDERS", "maintained_price"]

logger = logging.getLogger("guardstack")

#: The provider each wire's requests are priced at (``genai-prices``' provider ids).
PROVIDERS: Final = {"openai": "openai", "responses": "openai", "anthropic": "anthropic",
                    "gemini": "google"}  # fmt: skip
#: The usage read to learn a price (inside every provider's base tier).
_SAMPLE: Final = 1_000


@functools.lru_cache(maxsize=4_096)
def maintained_price(model: str, provider: str | None = None) -> Price | None:
    """``model``'s price per million tokens (input, output, cache reads, cache writes)
    from ``genai-prices``, or ``None`` when it is not installed or does not know it."""
    try:
        from genai_prices import Usage, calc_price
    except ImportError:
        return None
    per_million = 1_000_000 / _SAMPLE

    def price_of(**usage: int) -> float:
        found = calc_price(Usage(**usage), model, provider_id=provider)
        return float(found.total_price) * per_million

    try:
        per_input = price_of(input_tokens=_SAMPLE)
        per_output = price_of(output_tokens=_SAMPLE)
    except Exception:  # LookupError for a model it does not know; never a failure here
        return None
    try:
        per_read = price_of(input_tokens=_SAMPLE, cache_read_tokens=_SAMPLE)
        per_write = price_of(input_tokens=_SAMPLE, cache_write_tokens=_SAMPLE)
    except Exception:  # no cache prices: cached input at the input's price
        per_read = per_write = per_input
    return (per_input, per_output, per_read, per_write)
