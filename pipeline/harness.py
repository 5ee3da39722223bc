"""Assembly: plugins applied in order, each in its own scope, from code or from config.

``harness.plugin(p)`` applies a plugin — any guard or wrapper instance, or any
object with ``apply(scope)`` — and returns a handle whose ``dispose()`` removes
everything it registered. The order of ``plugin()`` calls is onion order: within
each stage, a plugin applied earlier is outside one applied later.

``harness.load(path_or_entries)`` does the same from the seed's configuration form,
a list of ``{id, name, config}`` entries (YAML, JSON, or TOML's ``[[plugins]]``), in
list order. Names resolve through the ``guardstack.plugins`` entry-point group or a
``module:attribute`` path; config keys may be snake_case or the seed's camelCase.
Anything wrong — an unknown name, an unknown key, a bad value — raises
``ConfigError`` at load naming the entry, the key and the value, and nothing of
that load stays applied.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol, cast, runtime_checkable

from pipeline.errors import ConfigError
from pipeline.loop import AgentLoop
from pipeline.model import Model
from pipeline.onion import Layer, Pipeline, Registration
from pipeline.registry import ToolRegistry

__all__ = ["PLUGIN_GROUP", "Harness", "Plugin", "PluginHandle", "Scope", "resolve_plugin"]

PLUGIN_GROUP = "guardstack.plugins"
_ENTRY_KEYS = frozenset({"id", "name", "config"})


@runtime_checkable
class Plugin(Protocol):
    """Anything ``harness.plugin`` accepts: it registers what it needs through the scope."""

    def apply(self, scope: Scope) -> None: ...


class Scope:
    """What a plugin registers through; all of it goes when the plugin's handle is disposed."""

    def __init__(self, harness: Harness, plugin_id: str) -> None:
        self.harness = harness
        self.tools: ToolRegistry = harness.tools
        self.loop: AgentLoop = harness.loop
        self.plugin_id = plugin_id
        self._registrations: list[Registration] = []

    def use(self, stage: Pipeline[Any], layer: Layer, *, name: str | None = None) -> Registration:
        """Add ``layer`` to ``stage`` (e.g. ``scope.tools.dispatch``) for this plugin."""
        return self.adopt(stage.use(layer, name=name))

    def adopt(self, registration: Registration) -> Registration:
        """Dispose ``registration`` with this plugin."""
        self._registrations.append(registration)
        return registration

    def on_dispose(self, callback: Callable[[], None]) -> None:
        self.adopt(Registration(callback))

    def _dispose(self) -> None:
        while self._registrations:
            self._registrations.pop().dispose()


class PluginHandle:
    """A plugin applied to a harness; ``dispose()`` removes all it registered."""

    def __init__(self, plugin_id: str, plugin: object, scope: Scope) -> None:
        self.id = plugin_id
        self.plugin = plugin
        self._scope = scope

    def dispose(self) -> None:
        self._scope._dispose()
        plugins = self._scope.harness.plugins
        if self in plugins:
            plugins.remove(self)

    def __repr__(self) -> str:
        return f"<PluginHandle {self.id!r}: {self.plugin!r}>"


def _plugin_name(plugin: object) -> str:
    name = getattr(plugin, "name", None)
    return name if isinstance(name, str) and name else type(plugin).__name__


class Harness:
    """A tool registry and an agent loop, assembled from plugins."""

    def __init__(
        self, model: Model | None = None, max_steps: int = 50, max_parallel_tool_calls: int = 1
    ) -> None:
        self.tools = ToolRegistry()
        self.loop = AgentLoop(self.tools, model, max_steps, max_parallel_tool_calls)
        self.plugins: list[PluginHandle] = []

    def plugin(self, plugin: Plugin, *, id: str | None = None) -> PluginHandle:
        """Apply ``plugin`` in its own scope; later plugins sit inside earlier ones."""
        apply = getattr(plugin, "apply", None)
        if not callable(apply):
            raise TypeError(f"{plugin!r} is not a plugin: it has no apply(scope) method")
        plugin_id = id or _plugin_name(plugin)
        scope = Scope(self, plugin_id)
        try:
            apply(scope)
        except BaseException:
            scope._dispose()
            raise
        handle = PluginHandle(plugin_id, plugin, scope)
        self.plugins.append(handle)
        return handle

    def load(
        self, source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any]
    ) -> list[PluginHandle]:
        """Apply the plugins a config file (or list of entries) names, in list order."""
        entries = _read_entries(source)
        handles: list[PluginHandle] = []
        try:
            for position, entry in enumerate(entries):
                plugin_id, plugin = _build(entry, position)
                try:
                    handles.append(self.plugin(plugin, id=plugin_id))
                except ConfigError as error:
                    raise error.for_plugin(repr(plugin_id)) from error
        except BaseException:
            for handle in reversed(handles):
                handle.dispose()
            raise
        return handles

    def describe(self) -> str:
        """The plugins in order, then every stage's layers, outermost first."""
        plugins = ", ".join(handle.id for handle in self.plugins) or "(none)"
        prompt = self.loop.prompt_submit.describe()
        prompt_lines = "\n".join(f"  {line}" for line in prompt.splitlines())
        return f"plugins: {plugins}\n{self.tools.describe()}\nprompt_submit:\n{prompt_lines}"


# -- configuration ---------------------------------------------------------------------


def _read_entries(
    source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
) -> list[Mapping[str, Any]]:
    origin = "configuration"
    data: Any = source
    if isinstance(source, str | os.PathLike):
        origin = os.fspath(source)
        data = _read_file(origin)
    if isinstance(data, Mapping):
        if set(data) != {"plugins"}:
            raise ConfigError(
                f"{origin}: expected a list of plugin entries or a `plugins` list, got keys "
                f"{sorted(map(str, data))}",
                key="plugins",
            )
        data = data["plugins"]
    if data is None:
        return []
    if isinstance(data, str | bytes) or not isinstance(data, Iterable):
        raise ConfigError(f"{origin}: expected a list of plugin entries, got {data!r}", value=data)
    entries: list[Mapping[str, Any]] = list(data)
    for position, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"{origin}: entry {position + 1} is not a mapping: {entry!r}", value=entry
            )
    return entries


def _read_file(path: str) -> Any:
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except OSError as error:
        raise ConfigError(f"cannot read plugin configuration {path}: {error}") from error
    suffix = os.path.splitext(path)[1].lower()
    try:
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as error:
                raise ConfigError(
                    f"{path}: reading YAML needs PyYAML: pip install 'guardstack[yaml]'"
                ) from error
            return yaml.safe_load(raw)
        if suffix == ".toml":
            return tomllib.loads(raw.decode("utf-8"))
        if suffix == ".json":
            return json.loads(raw)
    except ConfigError:
        raise
    except Exception as error:
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: {error}") from error
    raise ConfigError(
        f"{path}: unknown configuration format {suffix!r}; use .yaml, .yml, .toml or .json",
        value=suffix,
    )


def resolve_plugin(name: str) -> Callable[..., Any]:
    """The factory an entry's ``name`` means: an entry point, or ``module:attribute``."""
    for point in entry_points(group=PLUGIN_GROUP):
        if point.name == name:
            loaded: Callable[..., Any] = point.load()
            return loaded
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            target = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as error:
            raise ConfigError(
                f"cannot import plugin {name!r}: {error}", key="name", value=name
            ) from error
        if not callable(target):
            raise ConfigError(f"plugin {name!r} is not callable", key="name", value=name)
        return cast(Callable[..., Any], target)
    known = sorted(point.name for point in entry_points(group=PLUGIN_GROUP))
    raise ConfigError(
        f"unknown plugin name {name!r}; known names: {', '.join(known)} "
        "(or give a `module:attribute` path)",
        key="name",
        value=name,
    )


_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _snake(key: str) -> str:
    return _CAMEL_BOUNDARY.sub("_", key).lower()


def _build(entry: Mapping[str, Any], position: int) -> tuple[str, Any]:
    label = f"entry {position + 1}"
    name = entry.get("name")
    plugin_id = entry.get("id", name)
    if isinstance(plugin_id, str) and plugin_id:
        label = repr(plugin_id)
    for key in entry:
        if key not in _ENTRY_KEYS:
            raise ConfigError(
                f"plugin {label}: unknown entry key {key!r} = {entry[key]!r}; "
                "an entry has id, name and config",
                plugin=label,
                key=str(key),
                value=entry[key],
            )
    for key, value in (("name", name), ("id", plugin_id)):
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"plugin {label}: `{key}` must be a non-empty string, got {value!r}",
                plugin=label,
                key=key,
                value=value,
            )
    config = entry.get("config") or {}
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"plugin {label}: `config` must be a mapping, got {config!r}",
            plugin=label,
            key="config",
            value=config,
        )
    try:
        factory = resolve_plugin(str(name))  # checked above
    except ConfigError as error:
        raise error.for_plugin(label) from error
    accepted = _accepted_keys(factory)
    arguments: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in config.items():
        snake = _snake(str(key))
        if snake not in accepted:
            known = ", ".join(sorted(accepted)) or "none"
            raise ConfigError(
                f"plugin {label} ({name}): unknown config key {key!r} = {value!r}; "
                f"known keys: {known}",
                plugin=label,
                key=str(key),
                value=value,
            )
        if snake in arguments:
            raise ConfigError(
                f"plugin {label} ({name}): config key {key!r} given twice "
                f"(as {given_as[snake]!r} too)",
                plugin=label,
                key=str(key),
                value=value,
            )
        arguments[snake], given_as[snake] = value, str(key)
    try:
        return plugin_id, factory(**arguments)
    except ConfigError as error:
        key = given_as.get(error.key or "", error.key or "")
        detail = f"config key {key!r} = {config.get(key)!r}: " if key in config else ""
        raise ConfigError(
            f"plugin {label} ({name}): {detail}{error}",
            plugin=label,
            key=key,
            value=config.get(key),
        ) from error
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"plugin {label} ({name}): bad config {dict(config)!r}: {error}",
            plugin=label,
            value=dict(config),
        ) from error


def _accepted_keys(factory: Callable[..., Any]) -> set[str]:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {
        parameter.name
        for parameter in parameters
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        and not parameter.name.startswith("_")
    }
