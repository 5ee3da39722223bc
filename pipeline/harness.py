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

import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, cast

import attrs

from guardstack.pipeline.contract import Plugin, Scope
from guardstack.pipeline.control import Control
from guardstack.pipeline.decisions import decided
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.loop import AgentLoop
from guardstack.pipeline.model import Model
from guardstack.pipeline.plugin_config import (
    PLUGIN_GROUP,
    STORE_ENTRIES,
    build_plugin,
    in_file,
    read_config_file,
    read_entries,
    resolve_entry,
    resolve_plugin,
    reworded,
    store_of,
)
from guardstack.pipeline.registry import ToolRegistry
from guardstack.pipeline.store import MemoryStore, StateStore
from guardstack.pipeline.validate import cut

__all__ = [
    "PLUGIN_GROUP",
    "Harness",
    "PluginHandle",
    "Reloaded",
    "read_config_file",
    "resolve_plugin",
]


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
        #: What each application (by namespace) keeps in memory across reloads.
        self._kept: dict[str, dict[str, object]] = {}
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
            kept=self._kept.setdefault(namespace, {}),
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
            raise in_file(error, source) from error

    def _load(
        self,
        source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        allow_imports: bool,
    ) -> list[PluginHandle]:
        entries = read_entries(source)
        stores = [(n, e) for n, e in enumerate(entries) if e.get("name") in STORE_ENTRIES]
        if len(stores) > 1:
            raise ConfigError(
                f"entries {stores[0][0] + 1} and {stores[1][0] + 1}: one store per configuration",
                key="name",
                value=stores[1][1].get("name"),
            )
        if stores:
            self.store = store_of(*stores[0])
            self._store_entry = stores[0][1]
            entries = [e for e in entries if e.get("name") not in STORE_ENTRIES]
        factories = [
            resolve_entry(entry, position, allow_imports) for position, entry in enumerate(entries)
        ]
        handles: list[PluginHandle] = []
        try:
            for (plugin_id, name, factory), entry in zip(factories, entries, strict=True):
                plugin = build_plugin(plugin_id, name, factory, entry)
                try:
                    handles.append(self.plugin(plugin, id=plugin_id))
                except ConfigError as error:
                    raise reworded(error, plugin_id, name, {}) from error
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
        every cap's counts — carries over, and so does what it keeps through
        ``scope.kept`` (which turn each conversation is in, so a cap's per-turn counts go
        on); whatever else it kept in memory starts afresh. The
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
            named = in_file(error, source)
            decided("reload", layer="harness", decision="refused", reason=str(named))
            raise named from error
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
        ids = tuple(plugin_id for plugin_id, _ in built)
        said = f"stack version {self.version} ({', '.join(ids) or 'no plugins'})"
        decided("reload", layer="harness", decision="reloaded", reason=said)
        return Reloaded(self.version, ids, warnings)

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
        entries = read_entries(source)
        stores = [e for e in entries if e.get("name") in STORE_ENTRIES]
        if stores and (len(stores) > 1 or stores[0] != self._store_entry):
            raise ConfigError(
                "a reload keeps the store the harness has: restart to change it",
                key="name",
                value=stores[0].get("name"),
            )
        entries = [e for e in entries if e.get("name") not in STORE_ENTRIES]
        factories = [
            resolve_entry(entry, position, allow_imports) for position, entry in enumerate(entries)
        ]
        return [
            (plugin_id, build_plugin(plugin_id, name, factory, entry))
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
