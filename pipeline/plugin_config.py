"""Reading a plugin configuration: the file (bounded in size and depth), each entry, the
plugin it names and the keys it accepts — every mistake named with its file, plugin,
key and value."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, cast

from guardstack.pipeline.contract import Plugin
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.store import StateStore
from guardstack.pipeline.validate import cut, did_you_mean

PLUGIN_GROUP = "guardstack.plugins"
_ENTRY_KEYS = frozenset({"id", "name", "config"})
#: Entries that name the harness's state store rather than a layer (anywhere in the list).
STORE_ENTRIES = frozenset({"redis-store"})
STORE_GROUP = "guardstack.stores"
#: A configuration larger or deeper than this is refused before anything is built.
MAX_CONFIG_NODES = 10_000
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_BYTES = 1_000_000


def in_file(error: ConfigError, source: object) -> ConfigError:
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


def read_entries(
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


def _shown_key(key: object) -> str:
    """A key as an error may show it: a long one (a client key, perhaps) never whole."""
    text = str(key)
    return repr(text) if len(text) < 16 else f"{text[:4]!r}… ({len(text)} characters)"


def _unique_pairs(path: str) -> Any:
    """JSON's ``object_pairs_hook``: an object that names a key twice is refused (the
    later would silently win — a client key given to two tenants, say)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in items:
            if key in found:
                raise ConfigError(
                    f"{path}: an object names the key {_shown_key(key)} twice; the later "
                    "would silently win"
                )
            found[key] = value
        return found

    return pairs


def _unique_keys_loader(yaml: Any) -> Any:
    """PyYAML's safe loader, refusing a mapping that names a key twice (by its line)."""

    class UniqueKeys(yaml.SafeLoader):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    twice = key in seen
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if twice:
                    line = key_node.start_mark.line + 1
                    raise ConfigError(
                        f"line {line}: a mapping names the key {_shown_key(key)} twice; the "
                        "later would silently win"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


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
            return yaml.load(raw, Loader=_unique_keys_loader(yaml))
        if suffix == ".toml":
            return tomllib.loads(raw.decode("utf-8"))  # TOML refuses a key twice itself
        if suffix == ".json":
            return json.loads(raw, object_pairs_hook=_unique_pairs(path))
    except ConfigError as error:
        if str(error).startswith("line "):  # the YAML loader's: the file named here
            raise ConfigError(f"{path}: {error}") from None
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


def resolve_entry(
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


def store_of(position: int, entry: Mapping[str, Any]) -> StateStore:
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
    accepted = (
        "url",
        "prefix",
        "timeout_ms",
        "lease_ms",
        "idle_ttl_ms",
        "session_ttl_ms",
        "reservation_ttl_ms",
        "on_error",
        "idle_ttl_s",  # deprecated: every RedisStore duration is in ms
    )
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


def build_plugin(
    plugin_id: str, name: str, factory: type[Plugin], entry: Mapping[str, Any]
) -> Plugin:
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
        raise reworded(error, plugin_id, name, given_as) from error
    except Exception as error:
        # A wrong-typed value the plugin did not check itself (say, a provider that is
        # a number): still the entry, the config and the value, never a traceback.
        raise ConfigError(
            f"plugin {plugin_id!r} ({name}): bad config {cut(dict(config))}: "
            f"{type(error).__name__}: {cut(error, 300)}",
            plugin=plugin_id,
            value=dict(config),
        ) from error


def reworded(
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
