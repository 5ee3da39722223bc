"""Whose provider-side state a request may reach: stored responses belong to a tenant.

Every tenant's requests go upstream under the one provider key the proxy holds, and
the provider keeps state under that key: a Responses API reply is stored (``store``
defaults to true) and any request naming its id in ``previous_response_id`` continues
that conversation — the provider cannot tell tenants apart. So the proxy records, for
each response it relays, the tenant it answered, and a request naming a response of
another tenant (or one it never relayed) is answered as the provider answers an id it
does not know: 404 ``previous_response_not_found``. A tenant's own continuation works
as before.

What the proxy cannot attribute — stored conversations (``conversation``), uploaded
files (any ``file_id``, Gemini's ``fileData.fileUri``), Gemini's ``cachedContent`` and
code-execution ``container`` ids, which the proxy never
creates and so never saw made — is refused while tenants are configured (400 naming
the field): whoever holds such an id reached it outside the proxy.

The records live in the store's ledger (``Window`` entries never evicted to make room,
kept 30 days as the provider keeps a stored response), keyed by the response id and
the tenant as separate escaped parts — never a joined string one name could forge — so
every process on one shared store sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, Final

from guardstack.pipeline.contract import Window, new_token, store_key
from guardstack.pipeline.ledger import Ledger

logger = logging.getLogger("guardstack")

__all__ = ["OWNER_TTL_S", "ResponseOwners", "reaches_another", "unattributable"]

#: How long the provider keeps a stored response (OpenAI: 30 days), and so the record.
OWNER_TTL_S: Final = 30 * 86_400.0
_NAMESPACE: Final = "model-proxy"


class ResponseOwners:
    """Which tenant each relayed response belongs to, in ``ledger``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def _window(self, response_id: str, tenant: str) -> Window:
        key = store_key(_NAMESPACE, "response", response_id, "tenant", tenant)
        return Window(key, "owner", None, OWNER_TTL_S)

    async def record(self, response_id: str, tenant: str) -> None:
        """``response_id`` was relayed to ``tenant``: its continuations are the tenant's."""
        operation = store_key(_NAMESPACE, "owner", new_token())
        window = self._window(response_id, tenant)
        await self.ledger.reserve(operation, {"owner": 1.0}, [window])
        await self.ledger.settle(operation, {"owner": 1.0})

    async def owns(self, response_id: str, tenant: str) -> bool:
        return await self.ledger.balance(self._window(response_id, tenant)) > 0


def unattributable(data: Mapping[str, Any]) -> str | None:
    """The first field of a request that names provider-side state the proxy cannot
    attribute to a tenant (a stored conversation, a file, a container), or ``None``."""
    for field in ("conversation", "container", "cachedContent"):
        if data.get(field) not in (None, "", {}):
            return field
    for where in _file_ids(data, ""):
        return where
    return None


#: The fields that name a file stored at the provider: OpenAI's ``file_id``, and the
#: Gemini API's ``fileData.fileUri`` (an uploaded file, read under the proxy's key).
_STORED_FILES: Final = frozenset({"file_id", "fileUri", "file_uri"})


def _file_ids(value: Any, at: str) -> Iterator[str]:
    stack: list[tuple[Any, str]] = [(value, at)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                named = f"{where}.{key}" if where else str(key)
                if key in _STORED_FILES and inner not in (None, ""):
                    yield named
                elif isinstance(inner, dict | list):
                    stack.append((inner, named))
        elif isinstance(item, list):
            stack.extend((inner, f"{where}[{index}]") for index, inner in enumerate(item))


async def reaches_another(
    owners: ResponseOwners | None, wire: Any, tenant: str, data: Mapping[str, Any]
) -> Any | None:
    """The answer to a request that names provider-side state that is not its tenant's,
    or ``None``: a stored response of another tenant is one the provider does not know
    (404, in OpenAI's words); state the proxy cannot attribute, a 400."""
    from guardstack.gateway.model_proxy.replies import error_response

    field = unattributable(data)
    if field is not None:
        return error_response(
            wire,
            400,
            "invalid_request",
            f"{field} names state stored at the provider, which this gateway cannot "
            "tell is yours; send the content itself",
        )
    previous = data.get("previous_response_id")
    if wire.name != "responses" or not isinstance(previous, str) or not previous:
        return None
    try:
        owned = owners is not None and await owners.owns(previous, tenant)
    except Exception:
        logger.warning("model-proxy: the store did not say whose response %s is", previous)
        return error_response(
            wire, 503, "overloaded", "the gateway cannot check this response id now"
        )
    if owned:
        return None
    from starlette.responses import JSONResponse

    missing = {
        "error": {
            "message": f"Previous response with id '{previous}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    }
    return JSONResponse(missing, 404)
