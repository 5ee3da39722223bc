"""A model's optional members: each read in one place, with a default for a model that
lacks it or holds something else there."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.pipeline import ModelReply, StreamingModel
from guardstack.pipeline.model_members import (
    model_name_of,
    observes_estimates,
    provider_of,
    reports_chunks,
    stated_output_limit,
    switchable,
)


class Bare:
    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return ModelReply("ok")


class Full:
    model = "gpt-x"
    provider = "openai"
    max_tokens = 512
    reports_chunks = True
    observed_estimates = True

    def with_model(self, model: str) -> Full:
        other = Full()
        other.model = model
        return other

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, on_chunk: Any = None
    ) -> ModelReply:
        return ModelReply("ok")


def test_a_model_with_every_member_is_read_as_it_says() -> None:
    model = Full()
    assert (model_name_of(model), provider_of(model), stated_output_limit(model)) == (
        "gpt-x",
        "openai",
        512,
    )
    assert reports_chunks(model)
    assert observes_estimates(model)
    switch = switchable(model)
    assert switch is not None
    assert model_name_of(switch("gpt-y")) == "gpt-y"


def test_a_model_without_them_gets_the_defaults() -> None:
    model = Bare()
    assert (model_name_of(model), provider_of(model), stated_output_limit(model)) == (None,) * 3
    assert not reports_chunks(model)
    assert not observes_estimates(model)
    assert switchable(model) is None


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("model", ""),
        ("model", 5),
        ("provider", ""),
        ("provider", ["openai"]),
        ("max_tokens", True),
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("max_tokens", "512"),
        ("max_tokens", 1.5),
        ("reports_chunks", "yes"),
        ("reports_chunks", 1),
        ("observed_estimates", "true"),
        ("with_model", "gpt-y"),
    ],
)
def test_a_member_holding_something_else_is_read_as_missing(member: str, value: object) -> None:
    model = Bare()
    setattr(model, member, value)
    assert model_name_of(model) is None
    assert provider_of(model) is None
    assert stated_output_limit(model) is None
    assert not reports_chunks(model)
    assert not observes_estimates(model)
    assert switchable(model) is None


def test_the_protocols_name_what_a_checker_can_hold_an_adapter_to() -> None:
    streaming: StreamingModel = Full()  # mypy checks the shape; at run time, only a type
    assert reports_chunks(streaming)
