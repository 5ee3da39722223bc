"""The MCP gateway: several downstream MCP servers, many tenants, one guarded front door.

``guardstack mcp-proxy --config gateway.yaml [--keys keys.yaml]`` runs it; see
``docs/mcp-gateway.md``. ``config`` reads its files, ``downstream`` keeps each server
running, ``server`` serves them.
"""

from guardstack.gateway.mcp_gateway.config import (
    SEPARATOR,
    GatewayConfig,
    Keys,
    Quota,
    ServerSpec,
    Tenant,
    is_gateway_config,
    read_gateway,
    read_keys,
)
from guardstack.gateway.mcp_gateway.downstream import RESTARTING, Downstream
from guardstack.gateway.mcp_gateway.server import Gateway

__all__ = [
    "RESTARTING",
    "SEPARATOR",
    "Downstream",
    "Gateway",
    "GatewayConfig",
    "Keys",
    "Quota",
    "ServerSpec",
    "Tenant",
    "is_gateway_config",
    "read_gateway",
    "read_keys",
]
