"""What a gateway is told: its downstream servers, and who may see and call what.

The gateway's configuration file is a mapping::

    servers:                       # the mcpServers shape MCP clients use
      files: {command: npx, args: [-y, "@modelcontextprotocol/server-filesystem", /srv]}
      time: {command: uvx, args: [mcp-server-time], env: {TZ: UTC}}
      search: {url: "https://search.internal/mcp", headers: {authorization: "Bearer …"}}
    plugins:                       # the guard stack, as Harness.load reads it
      - {name: tool-call-timeout-policy}
      - {name: retry}

A server's name is letters, digits and ``-`` (``_`` is the separator): its tools,
prompts and resources are served as ``<server>_<name>``, a name every major MCP client
accepts. ``timeouts_ms: {PATTERN: MS}`` in a server's entry gives its tools budgets.

The keys file (``--keys``) maps client keys to tenants, and says what each tenant
sees::

    keys: {"k-9f2c…": team-a, "k-77aa…": team-b}
    tenants:
      team-a:
        servers: {files: {}, time: {tools: [get_current_time]}}
        quotas:
          - {server: time, calls_per_day: 500}
          - {server: files, tool: write_file, calls_per_hour: 20, per: key}
      team-b:
        servers: {search: {}}

A server a tenant does not list is not seen at all; ``tools:`` narrows a server to the
tools named (their downstream names). A quota is calls a UTC minute, hour or day, to a
server or one of its tools, counted ``per`` tenant (the default), key or conversation —
only calls, never listing or discovery — in the store's ledger (a ``RedisStore``
shares them across gateways).
Every mistake is a ``ConfigError`` naming the file, the key and the value.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from guardstack.gateway.tenants import key_id
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import read_config_file
from guardstack.pipeline.validate import cut, did_you_mean

__all__ = [
    "SEPARATOR",
    "GatewayConfig",
    "Keys",
    "Quota",
    "ServerSpec",
    "Tenant",
    "is_gateway_config",
    "read_gateway",
    "read_keys",
    "served_names",
]

#: Between a server's name and its tool's, prompt's or resource's in a served name.
SEPARATOR: Final = "_"
#: What a served name may hold, and how long it may be: what the strictest clients
#: accept (OpenAI's ``^[a-zA-Z0-9_-]{1,64}$`` for a function's name).
_SERVABLE: Final = re.compile(r"[A-Za-z0-9_-]+")
_NOT_SERVABLE: Final = re.compile(r"[^A-Za-z0-9_-]")
MAX_SERVED: Final = 64


def served_names(server: str, names: list[str]) -> dict[str, str]:
    """Each of a downstream's own names -> the name the gateway serves it under
    (``<server>_<name>``): letters, digits, ``_`` and ``-`` only, at most 64 in all.

    A name that already fits is served as it is. One that does not — a space, a dot,
    ``/``, a newline, a letter outside ASCII, too long — has each other character
    written ``_`` and a short digest of the name it came from added (``dots_in_name-
    3f9a1c``), so two names that map alike stay apart and a name is served under the
    same name every time the server is listed."""
    room = MAX_SERVED - len(server) - len(SEPARATOR)
    taken: set[str] = set()
    found: dict[str, str] = {}
    plain = [n for n in names if _SERVABLE.fullmatch(n) and len(n) <= room]
    for name in plain:
        found[name] = f"{server}{SEPARATOR}{name}"
        taken.add(name)
    for name in names:
        if name in found:
            continue
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
        for width in range(6, len(digest) + 1):
            tail = f"-{digest[:width]}"
            mapped = _NOT_SERVABLE.sub("_", name)[: max(0, room - len(tail))] + tail
            if mapped not in taken:
                break
        taken.add(mapped)
        found[name] = f"{server}{SEPARATOR}{mapped}"
    return found


_SERVER_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,39}")
_SERVER_KEYS: Final = ("command", "args", "env", "url", "headers", "timeouts_ms")


@attrs.frozen
class ServerSpec:
    """One downstream: a command to start (stdio) or a streamable-HTTP URL."""

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    timeouts_ms: Mapping[str, int] | None = None


@attrs.frozen
class GatewayConfig:
    """The gateway's servers (in file order) and its guard stack's entries."""

    servers: tuple[ServerSpec, ...]
    plugins: tuple[Mapping[str, Any], ...] = ()
    source: str = "<config>"

    def names(self) -> list[str]:
        return [server.name for server in self.servers]


#: The windows a quota counts calls in (UTC calendar windows).
QUOTA_WINDOWS: Final = ("minute", "hour", "day")
#: Whose calls a quota counts together.
QUOTA_PER: Final = ("tenant", "key", "conversation")


@attrs.frozen
class Quota:
    """At most ``calls`` calls a UTC ``window`` (minute, hour or day) to ``server`` (to
    its ``tool`` only, if named), counted ``per`` tenant, key or conversation. Listing
    and discovery are never counted: only ``tools/call``."""

    server: str
    calls: int
    tool: str | None = None
    per: str = "tenant"
    window: str = "day"

    @property
    def calls_per_day(self) -> int:
        """The day's limit (0.1's name; a quota of another window has none)."""
        return self.calls if self.window == "day" else 0

    def describe(self) -> str:
        where = f"{self.server}{SEPARATOR + self.tool if self.tool else ''}"
        return f"{where} {self.calls}/{self.window} per {self.per}"


@attrs.frozen
class Tenant:
    """What one tenant sees: servers (each ``None`` for all its tools, else those named)
    and its quotas."""

    name: str
    servers: Mapping[str, frozenset[str] | None]
    quotas: tuple[Quota, ...] = ()

    def sees(self, server: str, tool: str | None = None) -> bool:
        if server not in self.servers:
            return False
        allowed = self.servers[server]
        return tool is None or allowed is None or tool in allowed


@attrs.frozen
class Keys:
    """Client key -> tenant name, the tenants, and each key's id (``TENANT/NAME`` when the
    file names it, else its digest id): what a ``per: key`` quota counts by."""

    keys: Mapping[str, str]
    tenants: Mapping[str, Tenant]
    ids: Mapping[str, str] = attrs.field(factory=dict)

    def id_of(self, key: str | None) -> str | None:
        if not key or key not in self.keys:
            return None
        return self.ids.get(key) or key_id(key)

    def tenant_of(self, key: str | None) -> Tenant | None:
        name = self.keys.get(key) if key else None
        return self.tenants.get(name) if name is not None else None


def _fail(source: str, key: str, value: object, message: str) -> ConfigError:
    return ConfigError(f"{source}: {key}: {message}", key=key, value=value)


def is_gateway_config(path: Path) -> bool:
    """Whether ``path`` is a gateway's configuration (a mapping with ``servers``) rather
    than a plain list of plugins."""
    data = read_config_file(str(path), "gateway configuration")
    return isinstance(data, Mapping) and "servers" in data


def read_gateway(path: Path) -> GatewayConfig:
    """The gateway configuration in ``path`` (see the module docstring)."""
    source = str(path)
    data = read_config_file(source, "gateway configuration")
    if not isinstance(data, Mapping):
        raise _fail(source, "servers", data, "the file must be a mapping with `servers`")
    unknown = [key for key in data if key not in ("servers", "plugins")]
    if unknown:
        raise _fail(
            source,
            str(unknown[0]),
            data[unknown[0]],
            f"unknown key{did_you_mean(unknown[0], ('servers', 'plugins'))}; "
            "a gateway's file has servers and plugins",
        )
    servers = data.get("servers")
    if not isinstance(servers, Mapping) or not servers:
        raise _fail(
            source, "servers", servers, "a mapping of server names to their commands or URLs"
        )
    specs = tuple(_server(source, name, entry) for name, entry in servers.items())
    plugins = data.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, Mapping) for p in plugins):
        raise _fail(source, "plugins", plugins, "a list of {name, config} entries")
    return GatewayConfig(specs, tuple(plugins), source)


def _server(source: str, name: object, entry: object) -> ServerSpec:
    where = f"servers.{name}"
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        raise _fail(
            source,
            where,
            name,
            "a server's name is letters, digits and '-' (up to "
            "40; '_' separates it from the names it serves)",
        )
    if not isinstance(entry, Mapping):
        raise _fail(source, where, entry, "{command, args, env} or {url, headers}")
    for key in entry:
        if key not in _SERVER_KEYS:
            raise _fail(
                source,
                f"{where}.{key}",
                entry[key],
                f"unknown key{did_you_mean(str(key), _SERVER_KEYS)}",
            )
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise _fail(source, where, dict(entry), "give either `command` (stdio) or `url` (HTTP)")
    args = entry.get("args", [])
    if command is not None:
        if not isinstance(command, str) or not command:
            raise _fail(source, f"{where}.command", command, "the program to start (text)")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise _fail(source, f"{where}.args", args, "a list of text")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("http://", "https://"))
    ):
        raise _fail(source, f"{where}.url", url, "an http:// or https:// URL")
    env = _text_map(source, f"{where}.env", entry.get("env"))
    headers = _text_map(source, f"{where}.headers", entry.get("headers"))
    budgets = entry.get("timeouts_ms")
    if budgets is not None and (
        not isinstance(budgets, Mapping)
        or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
            for k, v in budgets.items()
        )
    ):
        raise _fail(source, f"{where}.timeouts_ms", budgets, "a mapping of tool pattern to ms")
    return ServerSpec(
        name,
        (command, *args) if command is not None else (),
        env,
        url,
        headers,
        dict(budgets) if budgets is not None else None,
    )


def _text_map(source: str, key: str, value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _fail(source, key, value, "a mapping of text to text")
    return dict(value)


def read_keys(path: Path, servers: list[str]) -> Keys:
    """The keys file in ``path``, checked against the gateway's ``servers``."""
    source = str(path)
    data = read_config_file(source, "keys file")
    if not isinstance(data, Mapping) or set(data) - {"keys", "tenants", "defaults", "prices"}:
        raise _fail(source, "keys", cut(data), "a mapping with `keys` and `tenants`")
    keys, tenants = data.get("keys"), data.get("tenants")
    if not isinstance(tenants, Mapping) or not tenants:
        raise _fail(source, "tenants", tenants, "a mapping of tenant names to what they see")
    found = {str(name): _tenant(source, name, entry, servers) for name, entry in tenants.items()}
    if not isinstance(keys, Mapping) or not keys:
        raise _fail(source, "keys", "…", "a mapping of client keys to tenant names")
    named: dict[str, str] = {}
    ids: dict[str, str] = {}
    for key, tenant in keys.items():
        if not isinstance(key, str) or len(key) < 16:
            raise _fail(source, "keys", "…", "each client key is text of 16 characters or more")
        if isinstance(tenant, Mapping):  # the tenants file's {tenant, team, name, …}
            name = tenant.get("name")
            tenant = tenant.get("tenant")
            if isinstance(name, str) and name:
                ids[key] = f"{tenant}/{name}"
        named[key] = tenant
        if tenant not in found:
            raise _fail(
                source,
                "keys",
                tenant,
                f"a key names the tenant {tenant!r}, which "
                f"`tenants` does not list{did_you_mean(str(tenant), list(found))}",
            )
    return Keys(named, found, ids)


def _tenant(source: str, name: object, entry: object, servers: list[str]) -> Tenant:
    where = f"tenants.{name}"
    if not isinstance(name, str) or not name:
        raise _fail(source, where, name, "a tenant's name is text")
    # the tenants file's budget, teams and models are the model proxy's; the gateway
    # reads servers and quotas
    if not isinstance(entry, Mapping) or set(entry) - {
        "servers",
        "quotas",
        "budget",
        "teams",
        "models",
    }:
        raise _fail(source, where, entry, "{servers: {...}, quotas: [...]}")
    seen = entry.get("servers")
    if not isinstance(seen, Mapping):
        raise _fail(source, f"{where}.servers", seen, "the servers this tenant sees")
    visible: dict[str, frozenset[str] | None] = {}
    for server, narrowing in seen.items():
        if server not in servers:
            raise _fail(
                source,
                f"{where}.servers",
                server,
                f"no server {server!r} in the "
                f"gateway{did_you_mean(str(server), servers)}; it has "
                f"{', '.join(servers)}",
            )
        if narrowing in (None, {}):
            visible[server] = None
        elif (
            isinstance(narrowing, Mapping)
            and set(narrowing) == {"tools"}
            and isinstance(narrowing["tools"], list)
            and all(isinstance(t, str) and t for t in narrowing["tools"])
        ):
            visible[server] = frozenset(narrowing["tools"])
        else:
            raise _fail(source, f"{where}.servers.{server}", narrowing, "{} or {tools: [...]}")
    quotas = [
        _quota(source, f"{where}.quotas[{n}]", quota, visible)
        for n, quota in enumerate(entry.get("quotas") or [])
    ]
    return Tenant(name, visible, tuple(quotas))


def _quota(source: str, where: str, quota: object, visible: Mapping[str, Any]) -> Quota:
    """One quota: ``{server, tool?, per?, calls_per_minute|hour|day}``, checked."""
    counts = [f"calls_per_{window}" for window in QUOTA_WINDOWS]
    allowed = {"server", "tool", "per", *counts}
    if not isinstance(quota, Mapping):
        raise _fail(source, where, quota, "{server, tool, per, calls_per_minute|hour|day}")
    for key in quota:
        if key not in allowed:
            near = did_you_mean(str(key), sorted(allowed))
            raise _fail(source, f"{where}.{key}", key, f"not a quota's key{near}")
    given = [count for count in counts if count in quota]
    if len(given) != 1:
        raise _fail(source, where, quota, "exactly one of calls_per_minute, _hour or _day")
    calls = quota[given[0]]
    server, tool, per = quota.get("server"), quota.get("tool"), quota.get("per", "tenant")
    if server not in visible:
        raise _fail(source, f"{where}.server", server, "a quota names a server this tenant sees")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise _fail(source, f"{where}.{given[0]}", calls, "a whole number >= 1")
    if tool is not None and not (isinstance(tool, str) and tool):
        raise _fail(source, f"{where}.tool", tool, "a tool's name (text)")
    if per not in QUOTA_PER:
        near = did_you_mean(str(per), QUOTA_PER)
        raise _fail(source, f"{where}.per", per, f"tenant, key or conversation{near}")
    window = given[0].removeprefix("calls_per_")
    return Quota(str(server), calls, tool, str(per), window)
