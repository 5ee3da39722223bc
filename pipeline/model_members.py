"""What a model may have besides ``complete``: each optional member named in a small
protocol, and read in one place.

None of these is required. guardstack reads each member through the function named
with it, which answers a sensible default for a model without it. Declaring one
(``class MyModel(StreamingModel): …``, or only matching it) lets mypy check the
member's shape; the adapters guardstack ships match every one they use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from guardstack.pipeline.model import ChunkListener, Model, ModelReply

__all__ = [
    "BoundedModel",
    "NamedModel",
    "ObservedModel",
    "ProvidedModel",
    "StreamingModel",
    "SwitchableModel",
    "model_name_of",
    "observes_estimates",
    "provider_of",
    "reports_chunks",
    "stated_input_tokens",
    "stated_output_limit",
    "switchable",
]


class NamedModel(Protocol):
    """A model that says which model it calls (``"gpt-4o"``): spans, metrics, breakers,
    prices and per-model limits key by it (``model_name_of``). Without one: ``model``."""

    @property
    def model(self) -> str: ...


class StreamingModel(Protocol):
    """A model that reports each piece of its reply as it arrives (``reports_chunks``),
    so ``Timeout(first_byte_ms=…, idle_ms=…)`` and ``LoopDetector(text=True)`` can watch
    a stream: it calls ``on_chunk(text)`` (``""`` for a piece without text) per piece."""

    @property
    def reports_chunks(self) -> bool: ...

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_chunk: ChunkListener | None = None,
    ) -> ModelReply: ...


class BoundedModel(Protocol):
    """A model that states the most output tokens it asks for (``stated_output_limit``):
    what a usage cap reserves for a call before the provider answers."""

    @property
    def max_tokens(self) -> int | None: ...


class SwitchableModel(Protocol):
    """A model that can call another model of its provider by name (``switchable``):
    what ``UsageLimit``'s ``downgrade: {to: "gpt-4o-mini"}`` and a fallback by name use."""

    def with_model(self, model: str) -> Model: ...


class ProvidedModel(Protocol):
    """A model that names its provider (``provider_of``) for ``gen_ai.provider.name``:
    ``openai``, ``anthropic``… Without one: ``_OTHER``, as the conventions say."""

    @property
    def provider(self) -> str: ...


class ObservedModel(Protocol):
    """A model whose calls a usage cap may reserve for by what its answers used so far
    (``observes_estimates``): under ``estimate: auto``, the model proxy's upstreams."""

    @property
    def observed_estimates(self) -> bool: ...


def model_name_of(model: object) -> str | None:
    """``NamedModel.model``, when the model names itself with text."""
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


def provider_of(model: object) -> str | None:
    """``ProvidedModel.provider``, when the model names its provider with text."""
    provider = getattr(model, "provider", None)
    return provider if isinstance(provider, str) and provider else None


def switchable(model: object) -> Callable[[str], Model] | None:
    """``SwitchableModel.with_model``, when the model has one."""
    switch = getattr(model, "with_model", None)
    return switch if callable(switch) else None


def observes_estimates(model: object) -> bool:
    """``ObservedModel.observed_estimates`` is ``True``."""
    return getattr(model, "observed_estimates", False) is True


def stated_output_limit(model: object) -> int | None:
    """``BoundedModel.max_tokens``: the output limit a model states, when a positive count."""
    stated = getattr(model, "max_tokens", None)
    if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
        return stated
    return None


def stated_input_tokens(model: object) -> int | None:
    """``EstimatingModel.input_tokens``: the input a model's request carries, as the model
    counts it (the model proxy's, by the request's wire), when a positive count."""
    stated = getattr(model, "input_tokens", None)
    if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
        return stated
    return None


def reports_chunks(model: object) -> bool:
    """``StreamingModel.reports_chunks`` is ``True``: it takes ``on_chunk=``."""
    return getattr(model, "reports_chunks", False) is True
