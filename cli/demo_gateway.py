"""The demo's gateway scene: a runaway agent behind ``guardstack model-proxy``, its
team's day spent, its run ended — in process (the proxy's ASGI app and a scripted
upstream through httpx's ASGI transport: no port, no network, no key)."""

from __future__ import annotations

import json
from typing import Any, TextIO

__all__ = ["gateway_section"]

CLIENT_KEY = "sk-acme-ci-bot-0123456789"
TENANTS: dict[str, Any] = {
    "keys": {CLIENT_KEY: {"tenant": "acme", "team": "ci", "name": "ci-bot"}},
    "tenants": {"acme": {"budget": {"usd_per_day": 50},
                         "teams": {"ci": {"budget": {"usd_per_day": 0.10}}}}},
    "prices": {"gpt-4o": [2.5, 10]},
}  # fmt: skip
#: What each of the runaway model's answers costs upstream: 8,000 tokens in, 400 out.
USAGE = {"prompt_tokens": 8_000, "completion_tokens": 400, "total_tokens": 8_400}


async def _runaway_model(scope: Any, receive: Any, send: Any) -> None:
    """An OpenAI-compatible upstream whose model asks to run the tests, every time."""
    while (await receive()).get("more_body"):
        pass
    answer = {
        "id": "chatcmpl-demo", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{id(scope)}", "type": "function",
                "function": {"name": "run_tests", "arguments": "{}"}}]}}],
        "usage": USAGE,
    }  # fmt: skip
    body = json.dumps(answer).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def gateway_section(out: TextIO) -> None:
    """Scene 6: the gateway with team budgets stopping a runaway agent."""
    import httpx

    from guardstack.gateway.model_proxy import ModelProxy
    from guardstack.gateway.tenants import tenants_of
    from guardstack.pipeline.harness import Harness

    out.write("6. The gateway: a team's budget ends a runaway agent's run\n\n")
    proxy = ModelProxy(
        Harness(),
        "http://upstream.invalid",
        tenants=tenants_of(TENANTS),
        upstream_transport=httpx.ASGITransport(app=_runaway_model),
    )
    messages: list[Any] = [{"role": "user", "content": "Make the build green."}]
    tools = [{"type": "function", "function": {"name": "run_tests", "parameters": {}}}]
    requests, stop = 0, ""
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=proxy.app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {CLIENT_KEY}"},
    )
    try:
        async with client:
            while requests < 50 and not stop:
                answer = await client.post(
                    "/v1/chat/completions",
                    json={"model": "gpt-4o", "messages": messages, "tools": tools,
                          "max_tokens": 500},
                )  # fmt: skip
                requests += 1
                message = answer.json()["choices"][0]["message"]
                if answer.headers.get("x-guardstack-stopped"):
                    stop = message["content"]
                    break
                messages.append(message)
                for call in message.get("tool_calls") or []:
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": "2 failed"}
                    )
    finally:
        await proxy.aclose()
    out.write(
        "   guardstack model-proxy --tenants tenants.yaml: team acme/ci may spend $0.10 a day;\n"
        "   its agent's model asks for run_tests on every answer (8,000 tokens in, 400 out).\n"
        f"   After {requests - 1} answers the day was spent, and request {requests} was answered "
        "as the\n   model's last words, nothing forwarded (HTTP 200, x-guardstack-stopped: "
        "budgets):\n"
        f"     {stop}\n"
        "   The agent's run ends there: no 429 for it to retry until tomorrow.\n\n"
    )
