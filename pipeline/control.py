"""Manual control: an operator's overrides, kept in the store so every process sees them.

``harness.control`` forces a circuit breaker open, closed or isolated, pauses a tool
(its calls are denied with a reason the model reads) and changes a limit at run time —
Polly's manual circuit control and a gateway's runtime limits, for a guard stack:

* ``force_open(tool, layer=None)`` — the breaker opens now, as if it had tripped, and
  half-opens after its ``break_s`` as usual;
* ``isolate(tool)`` — held open until ``release``: every call refused;
* ``force_closed(tool)`` — held closed until ``release``: the breaker never refuses;
* ``release(tool)`` — back to what the breaker decides itself;
* ``pause(tool, reason=…)`` / ``resume(tool)`` — the tool's calls denied (``TOOL_DENIED``,
  the reason in the text the model reads), then allowed again;
* ``set_limit(layer, tool=None, **values)`` / ``clear_limit(layer, tool=None)`` — a
  limit's numbers (``max_concurrent``, ``per_second``, ``tokens_per_minute``,
  ``per_turn``…; each layer names what it reads in ``controllable``) replaced at run
  time, for one tool or for all.

``layer`` is a plugin's id (``harness.plugins``); ``None`` means every breaker. An
override naming a breaker, layer, tool or value that does not exist is a
``ConfigError`` naming the ones that do, and changes nothing.

Overrides live in the harness's store (``ControlStore``: ``MemoryStore`` and
``RedisStore``) as one small record each. Layers read them from a snapshot of this
harness, read again from the store at most every ``refresh_s`` (one second), at the
next call that finds it stale, so an override made by one harness holds in every
harness on that store — another process's, or another in this process on one
``MemoryStore`` — within that. Every change is an event
(``guardstack.control``) and the overrides in force a gauge
(``guardstack.control.overrides``, by kind).
"""

from __future__ import annotations

import json
import logging
import math
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, Protocol, runtime_checkable

import attrs

from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.onion import Registration
from guardstack.pipeline.runtime import now
from guardstack.pipeline.signals import CONTROL_OVERRIDES, Signals
from guardstack.pipeline.validate import cut, did_you_mean

__all__ = ["Control", "ControlStore", "Override"]

logger = logging.getLogger("guardstack")

OverrideKind = Literal["breaker", "pause", "limit"]
BreakerMode = Literal["open", "isolated", "closed"]
#: How often a snapshot of a shared store's overrides is read again, at most.
REFRESH_S: Final = 1.0


@runtime_checkable
class ControlStore(Protocol):
    """Where overrides live: a small map of text, shared by every process the store is."""

    async def write_control(self, key: str, value: str | None) -> None:
        """Set ``key`` to ``value`` (``None``: remove it)."""
        ...

    async def read_controls(self) -> dict[str, str]:
        """Every override."""
        ...


@attrs.frozen
class Override:
    """One override in force: its kind, the layer (plugin id; ``None``: every one of
    that kind) and tool it is about (``None``: every tool), and what it says."""

    kind: OverrideKind
    layer: str | None
    tool: str | None
    value: Mapping[str, Any]
    #: When it was made (UTC seconds since the epoch), and who made it.
    at: float = 0.0
    by: str | None = None

    @property
    def key(self) -> str:
        return json.dumps([self.kind, self.layer, self.tool])

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "layer": self.layer,
                "tool": self.tool,
                "value": dict(self.value),
                "at": self.at,
                "by": self.by,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Override | None:
        try:
            data = json.loads(text)
            return cls(
                data["kind"],
                data["layer"],
                data["tool"],
                dict(data["value"]),
                float(data.get("at", 0.0)),
                data.get("by"),
            )
        except (ValueError, KeyError, TypeError):
            logger.warning("control: an override that cannot be read is ignored: %s", cut(text))
            return None


class Owner(Protocol):
    """What a ``Control`` serves: a harness (its store, plugins and tools)."""

    @property
    def store(self) -> object: ...

    @property
    def plugins(self) -> list[Any]: ...

    @property
    def tools(self) -> Any: ...


class Control:
    """One harness's overrides (see the module docstring)."""

    def __init__(self, owner: Owner, signals: Signals, *, refresh_s: float = REFRESH_S) -> None:
        # held weakly: a harness and its control make no reference cycle
        self._owner = weakref.ref(owner)
        self._signals = signals
        self.refresh_s = refresh_s
        #: The snapshot layers read: breakers by (layer, tool), pauses by tool, limits by
        #: (layer, tool).
        self.breakers: dict[tuple[str | None, str | None], Mapping[str, Any]] = {}
        self.paused: dict[str, str] = {}
        self.limits: dict[tuple[str, str | None], Mapping[str, float]] = {}
        self._overrides: dict[str, Override] = {}
        self._next_read = -math.inf
        self._warned_at = -math.inf
        self._gauge: Any = None  # registered at the first override
        #: What each breaker of the stack knows of a name's health (``watch_breakers``).
        self._health: list[Callable[[str], float | None]] = []
        #: When the tools are not the registry's — the model proxy decides on whatever
        #: tools the clients' models call — what they are (any name is then accepted).
        self.tools_are: str | None = None

    def _now(self) -> float:
        """The UTC wall clock (the store's, when it has one: its tests set it), which every
        process reads alike — a forced opening ends at the same instant everywhere."""
        clock = getattr(self._store_of(), "wall_clock", None)
        return float(clock()) if callable(clock) else time.time()

    def _store_of(self) -> object:
        owner = self._owner()
        return owner.store if owner is not None else None

    def _layers_of(self) -> list[tuple[str, object]]:
        owner = self._owner()
        return [(h.id, h.plugin) for h in owner.plugins] if owner is not None else []

    def _tools_of(self) -> list[str]:
        owner = self._owner()
        return list(owner.tools.names()) if owner is not None else []

    # -- reading (the layers) ------------------------------------------------------------

    @property
    def shared(self) -> bool:
        """Whether other processes may change the overrides (a store that suspends)."""
        return bool(getattr(self._store_of(), "suspends", False))

    def stale(self) -> bool:
        """Whether the snapshot should be read again before a call: at most every
        ``refresh_s``, whatever the store — a ``MemoryStore`` may be shared too, by
        several harnesses of one process, and an override one of them makes holds in
        the others within ``refresh_s``."""
        return self._next_read <= now()

    async def refresh(self) -> None:
        """Read the overrides again (a store that fails leaves the snapshot as it was)."""
        self._next_read = now() + self.refresh_s
        store = self._store_of()
        if not isinstance(store, ControlStore):
            return
        try:
            stored = await store.read_controls()
        except Exception as error:
            if now() - self._warned_at >= 60.0:  # at most once a minute while it is down
                self._warned_at = now()
                logger.warning(
                    "control: the overrides could not be read (%s); kept as they were", error
                )
            return
        found = {}
        for text in stored.values():
            override = Override.from_json(text)
            if override is not None:
                found[override.key] = override
        self._use(found)

    def breaker(self, layer: str, name: str) -> BreakerMode | None:
        """The mode an operator holds ``name``'s breaker of ``layer`` in, if any."""
        breakers = self.breakers
        if not breakers:
            return None
        for key in ((layer, name), (None, name), (layer, None), (None, None)):
            held = breakers.get(key)
            if held is None:
                continue
            until = held.get("until")
            if until is not None and self._now() >= until:
                continue  # a force_open whose break is over: the breaker decides again
            mode: BreakerMode = held["mode"]
            return mode
        return None

    def wait_s(self, layer: str, name: str) -> float:
        """How long until an operator's ``force_open`` of ``name``'s breaker ends (0:
        isolated, or none)."""
        for key in ((layer, name), (None, name), (layer, None), (None, None)):
            held = self.breakers.get(key)
            if held is not None:
                until = held.get("until")
                return max(0.0, until - self._now()) if until is not None else 0.0
        return 0.0

    def watch_breakers(self, open_for: Callable[[str], float | None]) -> Registration:
        """A breaker application says, for a tool or model name, how long until it lets
        a call try again (``None``: it lets calls through now). For ``open_for``."""
        self._health.append(open_for)

        def remove() -> None:
            if open_for in self._health:
                self._health.remove(open_for)

        return Registration(remove)

    def open_for(self, name: str) -> float | None:
        """How long until a call to ``name`` would get past every breaker of the stack
        (an operator's hold included; ``0``: held open until released), or ``None`` when
        none would refuse it now: what a health-aware ``Fallback`` asks."""
        waits = [wait for health in self._health if (wait := health(name)) is not None]
        held = self.breaker("", name) if self.breakers else None
        if held in ("open", "isolated"):
            waits.append(self.wait_s("", name) or math.inf)
        return max(waits) if waits else None

    def limit(self, layer: str, name: str | None, key: str) -> float | None:
        """An operator's value for ``key`` of ``layer`` (for ``name``, else for all)."""
        limits = self.limits
        if not limits:
            return None
        for entry in ((layer, name), (layer, None)):
            values = limits.get(entry)
            if values is not None and key in values:
                return values[key]
        return None

    # -- writing (the operator) ---------------------------------------------------------

    async def force_open(
        self, tool: str, *, layer: str | None = None, by: str | None = None
    ) -> None:
        """Open ``tool``'s breaker now; it half-opens after its ``break_s``."""
        breakers = self._breakers(layer)
        break_s = max(float(getattr(plugin, "break_s", 30.0)) for _, plugin in breakers)
        self._tool(tool, breakers)
        until = self._now() + break_s
        await self._write(
            Override("breaker", layer, tool, {"mode": "open", "until": until}, self._now(), by)
        )

    async def isolate(self, tool: str, *, layer: str | None = None, by: str | None = None) -> None:
        """Hold ``tool``'s breaker open until ``release``."""
        self._tool(tool, self._breakers(layer))
        await self._write(Override("breaker", layer, tool, {"mode": "isolated"}, self._now(), by))

    async def force_closed(
        self, tool: str, *, layer: str | None = None, by: str | None = None
    ) -> None:
        """Hold ``tool``'s breaker closed until ``release``: it never refuses."""
        self._tool(tool, self._breakers(layer))
        await self._write(Override("breaker", layer, tool, {"mode": "closed"}, self._now(), by))

    async def release(self, tool: str, *, layer: str | None = None, by: str | None = None) -> None:
        """Let ``tool``'s breaker decide for itself again."""
        self._breakers(layer)
        await self._remove(Override("breaker", layer, tool, {}, self._now(), by))

    async def pause(self, tool: str, *, reason: str, by: str | None = None) -> None:
        """Deny ``tool``'s calls, saying ``reason`` to the model, until ``resume``."""
        self._tool(tool, [])
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(
                "control.pause: give a reason (the model reads it)", key="reason", value=reason
            )
        await self._write(Override("pause", None, tool, {"reason": reason}, self._now(), by))

    async def resume(self, tool: str, *, by: str | None = None) -> None:
        """Allow ``tool``'s calls again."""
        await self._remove(Override("pause", None, tool, {}, self._now(), by))

    async def set_limit(
        self, layer: str, *, tool: str | None = None, by: str | None = None, **values: float
    ) -> None:
        """Replace ``values`` of ``layer``'s limit (for ``tool``, else for every tool)."""
        plugin = self._layer(layer)
        readable = sorted(getattr(plugin, "controllable", ()))
        if not values:
            raise ConfigError(
                f"control.set_limit: name a value of {layer} to change "
                f"({', '.join(readable) or 'it has none'})",
                key="values",
            )
        for key, value in values.items():
            if key not in readable:
                raise ConfigError(
                    f"control.set_limit: {layer} has no limit {key!r} to change"
                    f"{did_you_mean(key, readable)}; it reads {', '.join(readable) or 'none'}",
                    plugin=layer,
                    key=key,
                    value=value,
                )
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigError(
                    f"control.set_limit: {layer}.{key} must be a number > 0, got {cut(value)}",
                    plugin=layer,
                    key=key,
                    value=value,
                )
        if tool is not None:
            self._tool(tool, [])
        await self._write(Override("limit", layer, tool, dict(values), self._now(), by))

    async def clear_limit(
        self, layer: str, *, tool: str | None = None, by: str | None = None
    ) -> None:
        """Give ``layer``'s limit back its configured values."""
        self._layer(layer)
        await self._remove(Override("limit", layer, tool, {}, self._now(), by))

    async def overrides(self) -> list[Override]:
        """Every override in force (read from the store)."""
        await self.refresh()
        return list(self._overrides.values())

    # -- internals ------------------------------------------------------------------------

    def _breakers(self, layer: str | None) -> list[tuple[str, object]]:
        breakers = [(pid, p) for pid, p in self._layers_of() if _is_breaker(p)]
        names = [pid for pid, _ in breakers]
        if not breakers:
            raise ConfigError(
                "control: this stack has no circuit-breaker to force" + self._about_tools(),
                key="layer",
                value=layer,
            )
        if layer is None:
            return breakers
        chosen = [(pid, p) for pid, p in breakers if pid == layer]
        if not chosen:
            raise ConfigError(
                f"control: no circuit-breaker {layer!r}{did_you_mean(layer, names)}; the "
                f"breakers are {', '.join(names)}",
                key="layer",
                value=layer,
            )
        return chosen

    def _layer(self, layer: str) -> object:
        layers = dict(self._layers_of())
        if layer not in layers:
            known = sorted(layers)
            raise ConfigError(
                f"control: no layer {layer!r}{did_you_mean(layer, known)}; the plugins are "
                f"{', '.join(known) or 'none'}",
                key="layer",
                value=layer,
            )
        return layers[layer]

    def _about_tools(self) -> str:
        """What the tools are, when they are not the registry's (the model proxy)."""
        if self.tools_are is None:
            return ""
        return f" ({self.tools_are}; add circuit-breaker to the stack to force theirs)"

    def _tool(self, tool: str, breakers: list[tuple[str, object]]) -> None:
        known = self._tools_of()
        shared = [getattr(p, "key", None) for _, p in breakers]
        if tool in known or tool in shared:
            return
        on_models = any(getattr(p, "stage", None) == "model" for _, p in breakers)
        if (on_models or self.tools_are is not None) and isinstance(tool, str) and tool:
            return  # a model-stage breaker is per model; a proxy's tools are its clients'
        named = sorted(set(known) | {k for k in shared if k})
        raise ConfigError(
            f"control: no tool {tool!r}{did_you_mean(tool, named)}; the tools are "
            f"{', '.join(named[:20]) or 'none'}",
            key="tool",
            value=tool,
        )

    async def _write(self, override: Override) -> None:
        store = self._store_of()
        if isinstance(store, ControlStore):
            await store.write_control(override.key, override.to_json())
        found = dict(self._overrides)
        found[override.key] = override
        self._use(found)
        self._said(override, "set")

    async def _remove(self, override: Override) -> None:
        store = self._store_of()
        if isinstance(store, ControlStore):
            await store.write_control(override.key, None)
        found = dict(self._overrides)
        found.pop(override.key, None)
        self._use(found)
        self._said(override, "removed")

    def _use(self, found: dict[str, Override]) -> None:
        breakers: dict[tuple[str | None, str | None], Mapping[str, Any]] = {}
        paused: dict[str, str] = {}
        limits: dict[tuple[str, str | None], Mapping[str, float]] = {}
        for override in found.values():
            if override.kind == "breaker":
                breakers[(override.layer, override.tool)] = override.value
            elif override.kind == "pause" and override.tool is not None:
                paused[override.tool] = str(override.value.get("reason", "paused"))
            elif override.kind == "limit" and override.layer is not None:
                limits[(override.layer, override.tool)] = {
                    k: float(v) for k, v in override.value.items()
                }
        self._overrides = found
        self.breakers, self.paused, self.limits = breakers, paused, limits
        if found and self._gauge is None:
            self._gauge = self._signals.gauge(CONTROL_OVERRIDES, self._observed)

    def _said(self, override: Override, what: str) -> None:
        attributes: dict[str, Any] = {
            "guardstack.control.kind": override.kind,
            "guardstack.control.change": what,
        }
        if override.layer is not None:
            attributes["guardstack.layer"] = override.layer
        if override.tool is not None:
            attributes["gen_ai.tool.name"] = override.tool
        if override.by is not None:
            attributes["guardstack.control.by"] = override.by
        if what == "set":
            attributes["guardstack.control.value"] = json.dumps(dict(override.value))
        self._signals.event("guardstack.control", attributes, "WARN")
        logger.info(
            "control: %s %s %s",
            override.kind,
            what,
            override.key if what != "set" else override.to_json(),
        )

    def _observed(self) -> list[tuple[float, dict[str, Any]]]:
        counts: dict[str, int] = {}
        for override in self._overrides.values():
            counts[override.kind] = counts.get(override.kind, 0) + 1
        return [(float(n), {"kind": kind}) for kind, n in counts.items()]


def _is_breaker(plugin: object) -> bool:
    return getattr(plugin, "name", None) == "circuit-breaker"
