"""What a model call costs and reserves (``guards/usage_costs.py``): prices read and
checked, a usage priced by its parts, and ``estimate: observed``'s reservations."""

from __future__ import annotations

import pytest

from guardstack.guards.usage_costs import ObservedOutputs, cost_of, read_prices
from guardstack.pipeline import ConfigError, Usage


def test_observed_outputs_reserve_the_maximum_then_twice_the_largest_then_the_percentile() -> None:
    seen = ObservedOutputs()
    key = ("m", "t")
    assert seen.estimate(key) is None
    for size in (100, 300):
        seen.seen(key, size)
    assert seen.estimate(key) is None  # two answers: max_tokens still
    seen.seen(key, 200)
    assert seen.estimate(key) == 600  # twice the largest of a handful
    for size in range(1, 101):
        seen.seen(key, size)
    assert seen.estimate(key) == 98  # the 95th percentile of the 103 kept
    assert seen.estimate(("m", "other tenant")) is None


def test_a_usage_is_priced_by_its_parts() -> None:
    usage = Usage(1_000_000, 1_000_000, cached_input_tokens=400_000, cache_write_tokens=100_000)
    # 500k plain input at $3, 400k cache reads at $0.3, 100k cache writes at $3.75, 1M out at $15
    assert cost_of(usage, (3.0, 15.0, 0.3, 3.75)) == pytest.approx(1.5 + 0.12 + 0.375 + 15.0)


@pytest.mark.parametrize(
    ("prices", "key"),
    [
        ({"m": [1]}, "prices.m"),
        ({"m": "cheap"}, "prices.m"),
        ({"m": [1, -2]}, "prices.m"),
        ([1], "prices"),
    ],
)
def test_bad_prices_name_the_key(prices: object, key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        read_prices(prices)
    assert str(raised.value.key) == key
