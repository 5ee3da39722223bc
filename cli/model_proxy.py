"""``guardstack model-proxy``: an OpenAI-compatible API through an assembled guard stack.

    UPSTREAM_KEY=sk-… guardstack model-proxy --config guards.yaml \\
        --upstream https://api.openai.com --upstream-key-env UPSTREAM_KEY

then point the agent's base URL at ``http://127.0.0.1:8809/v1``. The configuration
is read, and the key looked up, before anything listens.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from guardstack.cli.mcp_proxy import _listen
from guardstack.integrations.model_proxy import ModelProxy
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.harness import Harness, read_config_file


def _keys(path: Path) -> dict[str, str]:
    """``--keys FILE``: client key -> tenant, every one text."""
    data = read_config_file(str(path), "keys")
    if (
        not isinstance(data, dict)
        or not data
        or not all(
            isinstance(key, str) and key and isinstance(tenant, str) and tenant
            for key, tenant in data.items()
        )
    ):
        raise ConfigError(
            f"model-proxy: {path}: --keys must map each client key to a tenant name (text)",
            key="keys",
            value=str(path),
        )
    return dict(data)


async def run_model_proxy(
    config: Path | None,
    upstream: str,
    *,
    key_env: str | None = None,
    keys: Path | None = None,
    listen: str = "127.0.0.1:8809",
    allow_imports: bool = False,
) -> None:
    """Serve until stopped."""
    import uvicorn

    host, port = _listen(listen)
    key = None
    if key_env is not None:
        key = os.environ.get(key_env)
        if not key:
            raise ConfigError(
                f"model-proxy: the environment variable {key_env!r} (--upstream-key-env) is "
                "not set",
                key="upstream-key-env",
                value=key_env,
            )
    client_keys = _keys(keys) if keys is not None else None
    harness = Harness()
    if config is not None:
        harness.load(config, allow_imports=allow_imports)
    proxy = ModelProxy(harness, upstream, upstream_key=key, client_keys=client_keys)
    print(f"guardstack model-proxy: serving http://{host}:{port}/v1", file=sys.stderr, flush=True)
    try:
        server = uvicorn.Server(
            uvicorn.Config(proxy.app, host=host, port=port, log_level="warning")
        )
        await server.serve()
    finally:
        await proxy.aclose()
