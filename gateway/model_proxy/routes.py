"""Where a request goes: one gateway in front of every provider.

``--upstream NAME=URL`` names upstreams (the unnamed ``--upstream URL`` is the
default); ``--route SELECTOR=NAME`` sends the requests a selector matches to one of
them, the first route that matches winning. A selector is a wire (``chat``,
``responses``, ``messages``, ``gemini``), a model glob (``deepseek-*``), or both
(``messages:claude-opus-*``). A request no route matches goes to the default; with
none, it is refused in its API's own shape (404, naming the model and the wire) and
nothing is forwarded. Requests are never translated between wires: a route only says
which upstream speaks the request's own.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable, Mapping
from typing import Final

import attrs

from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.validate import cut, did_you_mean

__all__ = ["SELECTORS", "WIRES", "Route", "Router", "read_route"]

#: A selector's wire names, and the wire each is (``Wire.name``).
WIRES: Final = {"chat": "openai", "responses": "responses", "messages": "anthropic",
                "gemini": "gemini"}  # fmt: skip
#: Each wire's selector name, by the wire's own name (the request log's ``wire``).
SELECTORS: Final = {wire: selector for selector, wire in WIRES.items()}
#: The upstream a Gemini request went to before routes, when one is named so: kept.
GEMINI: Final = "gemini"


@attrs.frozen
class Route:
    """Requests on ``wire`` (``None``: any) for a model matching ``model`` (a glob;
    ``None``: any) go to the upstream ``upstream``."""

    wire: str | None
    model: str | None
    upstream: str

    def matches(self, wire: str, model: str) -> bool:
        return (self.wire is None or WIRES[self.wire] == wire) and (
            self.model is None or fnmatch.fnmatchcase(model, self.model)
        )

    def __str__(self) -> str:
        selector = ":".join(part for part in (self.wire, self.model) if part is not None)
        return f"{selector}={self.upstream}"


def read_route(text: str) -> Route:
    """``SELECTOR=NAME`` (``--route``), checked."""
    selector, equals, upstream = text.rpartition("=")
    if not equals or not selector or not upstream:
        raise ConfigError(
            f"--route {cut(text)}: SELECTOR=UPSTREAM, where SELECTOR is a wire "
            f"({', '.join(WIRES)}), a model glob, or WIRE:GLOB",
            key="route",
            value=text,
        )
    wire, colon, model = selector.partition(":")
    if not colon:
        wire, model = (selector, "") if selector in WIRES else ("", selector)
    if wire and wire not in WIRES:
        raise ConfigError(
            f"--route {cut(text)}: {wire!r} is not a wire ({', '.join(WIRES)})"
            f"{did_you_mean(wire, list(WIRES))}",
            key="route",
            value=text,
        )
    return Route(wire or None, model or None, upstream)


class Router:
    """The routes over the named upstreams (``default``: the unnamed one, if given)."""

    def __init__(self, routes: Iterable[Route], upstreams: Collection[str], default: str | None):
        self.routes = tuple(routes)
        self.default = default
        for route in self.routes:
            if route.upstream not in upstreams:
                known = sorted(upstreams)
                raise ConfigError(
                    f"--route {route}: no upstream is named {route.upstream!r} "
                    f"(--upstream NAME=URL gives: {', '.join(known) or 'none'})"
                    f"{did_you_mean(route.upstream, known)}",
                    key="route",
                    value=str(route),
                )
        if GEMINI in upstreams and not any(r.wire == GEMINI for r in self.routes):
            self.routes += (Route(GEMINI, None, GEMINI),)  # as before routes existed

    def choose(self, wire: str, model: str) -> str | None:
        """The upstream a request on ``wire`` for ``model`` goes to, or ``None``."""
        for route in self.routes:
            if route.matches(wire, model):
                return route.upstream
        return self.default

    def describe(self, urls: Mapping[str, str]) -> list[str]:
        """One line per route, then the default (``guardstack check``, the start line)."""
        lines = [f"{route} -> {urls.get(route.upstream, '?')}" for route in self.routes]
        if self.default is not None:
            lines.append(f"anything else -> {urls.get(self.default, '?')}")
        else:
            lines.append("anything else -> refused (404): no default --upstream")
        return lines
