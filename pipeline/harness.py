"""Assembly: plugins applied in order, each in its own scope, from code or from config.

``harness.plugin(p)`` applies a plugin — any guard or wrapper instance, or any
object with ``apply(scope)`` — and returns a handle whose ``dispose()`` removes
everything it registered. The order of ``plugin()`` calls is onion order: within
each stage, a plugin applied earlier is outside one applied later.

``harness.load(path_or_entries)`` does the same from the seed's configuration form,
a list of ``{id, name, config}`` entries (YAML, JSON, or TOML's ``[[plugins]]``), in
list order. Config keys may be snake_case or the seed's camelCase.

**A config file runs no code of its own choosing.** Names resolve through the
``guardstack.plugins`` entry-point group only — the plugins installed
distributions declare. A ``module:attribute`` path is refused unless the caller
opts in (``allow_imports=True``, CLI ``--allow-imports``); even then the target
must be a class with ``apply(scope)`` (a plugin class), checked before anything is
called, and a module is imported only when the whole file has been read and
checked. Anything wrong — an unknown name, an unknown key, a bad value, a file
too large or too deep — raises ``ConfigError`` at load naming the entry, the key
and the value, and nothing of that load stays applied.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import tomllib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, cast

import attrs

from guardstack.pipeline.contract import Plugin, Scope
from guardstack.pipeline.control import Control
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.loop import AgentLoop
from guardstack.pipeline.model import Model
from guardstack.pipeline.registry import ToolRegistry
from guardstack.pipeline.store import MemoryStore, StateStore
from guardstack.pipeline.validate import cut, did_you_mean

__all__ = [
    "PLUGIN_GROUP",
    "Harness",
    "PluginHandle",
    "Reloaded",
    "read_config_file",
    "resolve_plugin",
]

PLUGIN_GROUP = "guardstack.plugins"
_ENTRY_KEYS = frozenset({"id", "name", "config"})
#: Entries that name the harness's state store rather than a layer (anywhere in the list).
_STORE_ENTRIES = frozenset({"redis-store"})
STORE_GROUP = "guardstack.stores"
#: A configuration larger or deeper than this is refused before anything is built.
MAX_CONFIG_NODES = 10_000
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_BYTES = 1_000_000


@attrs.frozen
class Reloaded:
    """What ``Harness.reload`` did: the stack's new version, its plugins in order, and
    what ``check`` warned about (a reload is never refused for a warning)."""

    version: int
    plugins: tuple[str, ...]
    warnings: tuple[str, ...] = ()


class PluginHandle:
    """A plugin applied to a harness; ``dispose()`` removes all it registered."""

    def __init__(self, harness: Harness, plugin_id: str, plugin: object, scope: Scope) -> None:
        self.id = plugin_id
        self.plugin = plugin
        self._harness = harness
        self._scope = scope

    def dispose(self) -> None:
        """Remove everything the plugin registered; idempotent."""
        self._scope.dispose()
        plugins = self._harness.plugins
        if self in plugins:
            plugins.remove(self)

    def __repr__(self) -> str:
        return f"<PluginHandle {self.id!r}: {cut(self.plugin)}>"


def _plugin_name(plugin: object) -> str:
    name = getattr(plugin, "name", None)
    return name if isinstance(name, str) and name else type(plugin).__name__


class Harness:
    """A tool registry and an agent loop, assembled from plugins."""

    def __init__(
        self,
        model: Model | None = None,
        max_steps: int = 50,
        max_parallel_tool_calls: int = 1,
        *,
        thread_limit: int = 40,
        system: str | None = None,
        store: StateStore | None = None,
    ) -> None:
        self.tools = ToolRegistry(thread_limit=thread_limit)
        self.loop = AgentLoop(self.tools, model, max_steps, max_parallel_tool_calls, system=system)
        self.plugins: list[PluginHandle] = []
        if store is not None and not isinstance(store, StateStore):
            raise ConfigError(
                f"Harness: `store` must be a StateStore (a MemoryStore, a RedisStore), "
                f"got {cut(store)}",
                key="store",
                value=store,
            )
        #: Where every keyed layer and cap of this harness keeps state (unless given its own).
        self.store: StateStore = store if store is not None else MemoryStore()
        self._applied: dict[str, int] = {}
        #: An operator's overrides: breakers forced, tools paused, limits changed, in the
        #: store so every process sees them (see ``pipeline.control``).
        self.control = Control(self, self.loop.signals)
        self.tools.control = self.control
        #: The stack's version: 0 as built, one more at each ``reload``.
        self.version = 0
        self._store_entry: Mapping[str, Any] | None = None

    def plugin(self, plugin: Plugin, *, id: str | None = None) -> PluginHandle:
        """Apply ``plugin`` in its own scope; later plugins sit inside earlier ones."""
        if isinstance(plugin, type):
            raise TypeError(
                f"harness.plugin() takes a plugin instance, got the class {plugin.__name__}; "
                f"write harness.plugin({plugin.__name__}()) (with its configuration)"
            )
        apply = getattr(plugin, "apply", None)
        if not callable(apply):
            raise TypeError(f"{cut(plugin)} is not a plugin: it has no apply(scope) method")
        plugin_id = id or _plugin_name(plugin)
        # The n-th application of one id gets its own state: ``retry``, ``retry#2``…
        applied = self._applied[plugin_id] = self._applied.get(plugin_id, 0) + 1
        namespace = plugin_id if applied == 1 else f"{plugin_id}#{applied}"
        scope = Scope(
            self.tools,
            self.loop,
            plugin_id,
            store=self.store,
            namespace=namespace,
            control=self.control,
            version=self.version,
        )
        try:
            apply(scope)
        except BaseException:
            scope.dispose()
            raise
        handle = PluginHandle(self, plugin_id, plugin, scope)
        self.plugins.append(handle)
        return handle

    def load(
        self,
        source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        *,
        allow_imports: bool = False,
    ) -> list[PluginHandle]:
        """Apply the plugins a config file (or list of entries) names, in list order.

        ``allow_imports=True`` also accepts ``module:attribute`` names (importing that
        module runs its code: only for files you trust).
        """
        try:
            return self._load(source, allow_imports)
        except ConfigError as error:
            raise _in_file(error, source) from error

    def _load(
        self,
        source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        allow_imports: bool,
    ) -> list[PluginHandle]:
        entries = _read_entries(source)
        stores = [(n, e) for n, e in enumerate(entries) if e.get("name") in _STORE_ENTRIES]
        if len(stores) > 1:
            raise ConfigError(
                f"entries {stores[0][0] + 1} and {stores[1][0] + 1}: one store per configuration",
                key="name",
                value=stores[1][1].get("name"),
            )
        if stores:
            self.store = _store(*stores[0])
            self._store_entry = stores[0][1]
            entries = [e for e in entries if e.get("name") not in _STORE_ENTRIES]
        factories = [
            _resolve_entry(entry, position, allow_imports) for position, entry in enumerate(entries)
        ]
        handles: list[PluginHandle] = []
        try:
            for (plugin_id, name, factory), entry in zip(factories, entries, strict=True):
                plugin = _build(plugin_id, name, factory, entry)
                try:
                    handles.append(self.plugin(plugin, id=plugin_id))
                except ConfigError as error:
                    raise _reworded(error, plugin_id, name, {}) from error
        except BaseException:
            for handle in reversed(handles):
                handle.dispose()
            raise
        return handles

    def reload(
        self,
        source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        *,
        allow_imports: bool = False,
        check: Callable[[Harness], Any] | None = None,
    ) -> Reloaded:
        """Swap the stack for the one ``source`` configures, while agents run.

        The new stack is built and applied to a scratch harness first (the same tools
        and model): a configuration that does not load — an unknown plugin or key, a bad
        value, a layer that refuses this stack — raises ``ConfigError`` naming file,
        plugin, key and value, and nothing changes. ``check(harness)`` (the CLI's
        ``guardstack check``), if given, reports its warnings; they never stop a reload.
        Then the swap, with nothing that can suspend from its first removal to its last
        application: a call that started on the old stack finishes on it (each call
        takes its stages as they are when it starts), the next runs on the new one. A
        plugin keeps its id, so what it keeps in the store — breaker windows, buckets,
        every cap's counts — carries over; what it kept in memory starts afresh. The
        store itself is the one the harness has: a reload may not name another.
        """
        try:
            built = self._built(source, allow_imports)
            scratch = Harness(self.loop.model, self.loop.max_steps, store=MemoryStore())
            for name in self.tools.names():
                definition = self.tools.get(name)
                if definition is not None:
                    scratch.tools.register(definition)
            for plugin_id, plugin in built:
                scratch.plugin(plugin, id=plugin_id)
        except ConfigError as error:
            raise _in_file(error, source) from error
        warnings = tuple(getattr(check(scratch), "warnings", ())) if check else ()
        old = [(handle.id, cast(Plugin, handle.plugin)) for handle in self.plugins]
        before = self.version
        self.version += 1
        try:
            self._swap(built)  # no await from the first removal to the last application
        except BaseException:  # it applied on the scratch harness: a plugin that is not
            self.version = before  # pure; the old stack back, as it was
            self._swap(old)
            raise
        return Reloaded(self.version, tuple(plugin_id for plugin_id, _ in built), warnings)

    def _swap(self, plugins: Sequence[tuple[str, Plugin]]) -> None:
        for handle in reversed(list(self.plugins)):
            handle.dispose()
        self._applied.clear()  # the same ids: the same namespaces, the same stored state
        for plugin_id, plugin in plugins:
            self.plugin(plugin, id=plugin_id)

    def _built(
        self,
        source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        allow_imports: bool,
    ) -> list[tuple[str, Plugin]]:
        """The plugins ``source`` configures, built (not applied)."""
        entries = _read_entries(source)
        stores = [e for e in entries if e.get("name") in _STORE_ENTRIES]
        if stores and (len(stores) > 1 or stores[0] != self._store_entry):
            raise ConfigError(
                "a reload keeps the store the harness has: restart to change it",
                key="name",
                value=stores[0].get("name"),
            )
        entries = [e for e in entries if e.get("name") not in _STORE_ENTRIES]
        factories = [
            _resolve_entry(entry, position, allow_imports) for position, entry in enumerate(entries)
        ]
        return [
            (plugin_id, _build(plugin_id, name, factory, entry))
            for (plugin_id, name, factory), entry in zip(factories, entries, strict=True)
        ]

    def reset(self, conversation: Hashable | None) -> None:
        """Start a new person's turn in ``conversation``, for callers outside the loop.

        Every applied plugin with ``reset(conversation)`` (the reminder's chain, a
        cap's per-turn counts) forgets that conversation, as a new prompt does for
        the loop's own agents. Framework adapters call it when a new run starts.
        """
        for handle in list(self.plugins):
            reset = getattr(handle.plugin, "reset", None)
            if callable(reset):
                reset(conversation)

    def describe(self) -> str:
        """The plugins in order, then every stage's layers, outermost first."""
        plugins = ", ".join(handle.id for handle in self.plugins) or "(none)"
        loop_stages = "".join(
            f"\n{stage.stage}:\n" + "\n".join(f"  {line}" for line in stage.describe().splitlines())
            for stage in (self.loop.prompt_submit, self.loop.model_call)
        )
        return f"plugins: {plugins}\n{self.tools.describe()}{loop_stages}"


# -- configuration ---------------------------------------------------------------------


def _in_file(error: ConfigError, source: object) -> ConfigError:
    """The error, naming the file it came from (once) when the configuration was a file."""
    if not isinstance(source, str | os.PathLike):
        return error
    path = os.fspath(source)
    message = str(error)
    if path in message:
        return error
    return ConfigError(
        f"{path}: {message}",
        plugin=error.plugin,
        key=error.key,
        value=error.value,
        reason=error.reason,
    )


def _read_entries(
    source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
) -> list[Mapping[str, Any]]:
    origin = "configuration"
    data: Any = source
    if isinstance(source, str | os.PathLike):
        origin = os.fspath(source)
        data = read_config_file(origin)
    _check_size(origin, data)
    if isinstance(data, Mapping):
        if set(data) != {"plugins"}:
            raise ConfigError(
                f"{origin}: expected a list of plugin entries or a `plugins` list, got keys "
                f"{cut(sorted(map(str, data)))}",
                key="plugins",
            )
        data = data["plugins"]
    if data is None:
        return []
    if isinstance(data, str | bytes) or not isinstance(data, Iterable):
        raise ConfigError(
            f"{origin}: expected a list of plugin entries, got {cut(data)}", value=data
        )
    entries: list[Mapping[str, Any]] = list(data)
    for position, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"{origin}: entry {position + 1} is not a mapping: {cut(entry)}", value=entry
            )
    return entries


def _check_size(origin: str, data: object) -> None:
    """Refuse absurd configurations (a YAML alias bomb) before anything walks them whole."""
    budget = MAX_CONFIG_NODES
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise ConfigError(
                f"{origin}: the configuration expands to more than {MAX_CONFIG_NODES} "
                "values (repeated YAML aliases?); refused"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(
                f"{origin}: the configuration is nested deeper than {MAX_CONFIG_DEPTH} levels; "
                "refused"
            )
        if isinstance(node, Mapping):
            stack.extend((child, depth + 1) for pair in node.items() for child in pair)
        elif isinstance(node, list | tuple):
            stack.extend((child, depth + 1) for child in node)


def _syntax_error(path: str, kind: str, error: Exception) -> ConfigError:
    """A parse error with its line and column, in words (never a parser's object repr)."""
    mark = getattr(error, "problem_mark", None)  # PyYAML
    if mark is not None:
        problem = getattr(error, "problem", None) or "syntax error"
        context = getattr(error, "context", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        detail = f"{problem} ({context})" if context else str(problem)
        return ConfigError(f"{path}: not valid {kind} at {where}: {detail}")
    if isinstance(error, json.JSONDecodeError):
        return ConfigError(
            f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
        )
    return ConfigError(f"{path}: not valid {kind}: {cut(str(error), 300)}")  # TOML names both


def read_config_file(path: str, what: str = "plugin configuration") -> Any:
    """A YAML, TOML or JSON file's data, size-limited; ``ConfigError`` on anything wrong."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from error
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; refused")
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
        raise _syntax_error(path, suffix[1:].upper(), error) from error
    raise ConfigError(
        f"{path}: unknown configuration format {suffix!r}; use .yaml, .yml, .toml or .json",
        value=suffix,
    )


def _is_plugin_class(target: object) -> bool:
    return inspect.isclass(target) and callable(getattr(target, "apply", None))


def resolve_plugin(name: str, *, allow_imports: bool = False) -> type[Plugin]:
    """The plugin class an entry's ``name`` means.

    An entry-point name of the ``guardstack.plugins`` group; with ``allow_imports``,
    also a ``module:attribute`` path. Either way the target must be a plugin class
    (a class with ``apply``), checked before it is called.
    """
    for point in entry_points(group=PLUGIN_GROUP):
        if point.name == name:
            target = point.load()
            if not _is_plugin_class(target):
                raise ConfigError(
                    f"entry point {name!r} is not a plugin class", key="name", value=name
                )
            return cast(type[Plugin], target)
    if ":" in name and not allow_imports:
        raise ConfigError(
            f"plugin name {cut(name)} is a module path; a configuration file may only name "
            "installed plugins (entry points) unless imports are allowed "
            "(harness.load(..., allow_imports=True), CLI --allow-imports)",
            key="name",
            value=name,
        )
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            target = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except Exception as error:
            raise ConfigError(
                f"cannot import plugin {cut(name)}: {cut(error, 300)}", key="name", value=name
            ) from error
        if not _is_plugin_class(target):
            raise ConfigError(
                f"{cut(name)} is not a plugin class (a class with apply(scope)); it is not called",
                key="name",
                value=name,
            )
        return cast(type[Plugin], target)
    known = sorted(point.name for point in entry_points(group=PLUGIN_GROUP))
    raise ConfigError(
        f"unknown plugin name {cut(name)}{did_you_mean(name, known)}; "
        f"known names: {', '.join(known)}",
        key="name",
        value=name,
    )


_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _snake(key: str) -> str:
    return _CAMEL_BOUNDARY.sub("_", key).lower()


def _resolve_entry(
    entry: Mapping[str, Any], position: int, allow_imports: bool
) -> tuple[str, str, type[Plugin]]:
    """Check an entry's shape and find its plugin class; nothing is built yet."""
    label = f"entry {position + 1}"
    name = entry.get("name")
    plugin_id = entry.get("id", name)
    if isinstance(plugin_id, str) and plugin_id:
        label = repr(plugin_id)
    for key in entry:
        if key not in _ENTRY_KEYS:
            raise ConfigError(
                f"plugin {label}: unknown entry key {cut(key)} = {cut(entry[key])}; "
                "an entry has id, name and config",
                plugin=plugin_id if isinstance(plugin_id, str) else None,
                key=str(key),
                value=entry[key],
            )
    for key, value in (("name", name), ("id", plugin_id)):
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"plugin {label}: `{key}` must be a non-empty string, got {cut(value)}",
                key=key,
                value=value,
            )
    name, plugin_id = str(name), str(plugin_id)  # checked just above
    config = entry.get("config")
    if config is not None and not isinstance(config, Mapping):
        raise ConfigError(
            f"plugin {label} ({name}): `config` must be a mapping, got {cut(config)}",
            plugin=plugin_id,
            key="config",
            value=config,
        )
    try:
        factory = resolve_plugin(name, allow_imports=allow_imports)
    except ConfigError as error:
        raise ConfigError(
            f"plugin {label}: {error.reason}", plugin=plugin_id, key="name", value=name
        ) from error
    return plugin_id, name, factory


def _store(position: int, entry: Mapping[str, Any]) -> StateStore:
    """The state store a ``redis-store`` entry configures (its constructor's keywords)."""
    name = str(entry.get("name"))
    label = f"entry {position + 1} ({name})"
    for key in entry:
        if key not in ("name", "config"):
            raise ConfigError(
                f"{label}: unknown entry key {cut(key)}; a store entry has name and config",
                plugin=name,
                key=str(key),
                value=entry[key],
            )
    config = entry.get("config") or {}
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"{label}: `config` must be a mapping, got {cut(config)}",
            plugin=name,
            key="config",
            value=config,
        )
    [point] = [p for p in entry_points(group=STORE_GROUP) if p.name == name]
    try:
        factory = point.load()
    except ImportError as error:
        raise ConfigError(f"{label}: {error}", plugin=name, key="name", value=name) from error
    accepted = ("url", "prefix", "timeout_ms", "lease_ms", "idle_ttl_s", "on_error")
    arguments: dict[str, Any] = {}
    for key, value in config.items():
        snake = _snake(str(key))
        if snake not in accepted:
            raise ConfigError(
                f"{label}: unknown config key {cut(key)}{did_you_mean(snake, accepted)}; "
                f"known keys: {', '.join(accepted)}",
                plugin=name,
                key=str(key),
                value=value,
            )
        arguments[snake] = value
    try:
        store: StateStore = factory(**arguments)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{label}: {error}", plugin=name, key="config", value=config) from error
    return store


def _build(plugin_id: str, name: str, factory: type[Plugin], entry: Mapping[str, Any]) -> Plugin:
    config: Mapping[str, Any] = entry.get("config") or {}
    accepted = _accepted_keys(factory)
    arguments: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in config.items():
        snake = _snake(str(key))
        if snake not in accepted:
            known = ", ".join(sorted(accepted)) or "none"
            raise ConfigError(
                f"plugin {plugin_id!r} ({name}): unknown config key {cut(key)} = {cut(value)}"
                f"{did_you_mean(snake, accepted)}; "
                f"known keys: {known}",
                plugin=plugin_id,
                key=str(key),
                value=value,
            )
        if snake in arguments:
            raise ConfigError(
                f"plugin {plugin_id!r} ({name}): config key {key!r} given twice "
                f"(as {given_as[snake]!r} too)",
                plugin=plugin_id,
                key=str(key),
                value=value,
            )
        arguments[snake], given_as[snake] = value, str(key)
    try:
        return factory(**arguments)
    except ConfigError as error:
        raise _reworded(error, plugin_id, name, given_as) from error
    except Exception as error:
        # A wrong-typed value the plugin did not check itself (say, a provider that is
        # a number): still the entry, the config and the value, never a traceback.
        raise ConfigError(
            f"plugin {plugin_id!r} ({name}): bad config {cut(dict(config))}: "
            f"{type(error).__name__}: {cut(error, 300)}",
            plugin=plugin_id,
            value=dict(config),
        ) from error


def _reworded(
    error: ConfigError, plugin_id: str, name: str, given_as: Mapping[str, str]
) -> ConfigError:
    """The plugin's own error, naming the entry (by id), the key and the value once each."""
    key = given_as.get(error.key or "", error.key)
    where = f"plugin {plugin_id!r} ({name})"
    if key is not None:
        where += f": config key {key!r} = {cut(error.value)}"
    return ConfigError(
        f"{where}: {error.reason}",
        plugin=plugin_id,
        key=key,
        value=error.value,
        reason=error.reason,
    )


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
