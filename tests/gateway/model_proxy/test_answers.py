"""Stop at the answer that asks (``model_proxy/answers.py``), per API, JSON and streamed,
read by each provider's official client: under ``ToolCallLimit(per_turn=1)`` the
first answer's call goes through as it came; the second answer's call is taken out and
the stop's text put in its place, with the API's own "the turn is over" ending — so
the agent runs one command, not two. The upstream is a loopback runaway that asks for
the same call every time (``tests/integrations/runaway.py``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from guardstack.guards import ToolCallLimit
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import Served, serve
from tests.integrations.runaway import Runaway

TOOL = "run"
STOP = "Stopped by tool-call-limit: tool call limit reached"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def runaway() -> Iterator[Runaway]:
    with Runaway(bound=10, tool=TOOL, arguments={"command": "ls"}) as running:
        yield running


async def served(runaway: Runaway) -> AsyncIterator[Served]:
    harness = Harness()
    harness.plugin(ToolCallLimit(per_turn=1))
    async for running in serve(harness, runaway):
        yield running


# -- one agent loop per API, with its official client ------------------------------------


async def anthropic_loop(port: int, stream: bool) -> list[Any]:
    from anthropic import AsyncAnthropic

    client = AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0)
    tools: Any = [{"name": TOOL, "input_schema": {"type": "object"}}]
    messages: list[Any] = [{"role": "user", "content": "List the files."}]
    answers = []
    async with client:
        for _ in range(2):
            answer: Any
            if stream:
                async with client.messages.stream(
                    model="claude-x", max_tokens=100, messages=messages, tools=tools
                ) as events:
                    answer = await events.get_final_message()
            else:
                answer = await client.messages.create(
                    model="claude-x", max_tokens=100, messages=messages, tools=tools
                )
            answers.append(answer)
            calls = [block for block in answer.content if block.type == "tool_use"]
            if not calls:
                break
            messages += [
                {"role": "assistant", "content": [block.model_dump() for block in answer.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                              "content": "a.py"}]},
            ]  # fmt: skip
    return answers


async def chat_loop(port: int, stream: bool) -> list[Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": TOOL, "parameters": {}}}]
    messages: list[Any] = [{"role": "user", "content": "List the files."}]
    answers = []
    async with client:
        for _ in range(2):
            if stream:
                async with client.beta.chat.completions.stream(
                    model="m", messages=messages, tools=tools
                ) as events:
                    answer: Any = await events.get_final_completion()
            else:
                answer = await client.chat.completions.create(
                    model="m", messages=messages, tools=tools
                )
            answers.append(answer)
            message = answer.choices[0].message
            if not message.tool_calls:
                break
            messages += [
                message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "a.py"},
            ]
    return answers


async def responses_loop(port: int, stream: bool) -> list[Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    tools: Any = [{"type": "function", "name": TOOL, "parameters": {}}]
    items: list[Any] = [{"role": "user", "content": "List the files."}]
    answers = []
    async with client:
        for _ in range(2):
            answer: Any
            if stream:
                async with client.responses.stream(model="m", input=items, tools=tools) as events:
                    answer = await events.get_final_response()
            else:
                answer = await client.responses.create(model="m", input=items, tools=tools)
            answers.append(answer)
            calls = [item for item in answer.output if item.type == "function_call"]
            if not calls:
                break
            items += [
                calls[0].model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "a.py"},
            ]
    return answers


async def gemini_loop(port: int, stream: bool) -> list[Any]:
    from google import genai
    from google.genai import types

    client = genai.Client(
        api_key="k", http_options=types.HttpOptions(base_url=f"http://127.0.0.1:{port}")
    )
    declaration = types.FunctionDeclaration(name=TOOL, parameters_json_schema={"type": "object"})
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[declaration])])
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text="List files.")])]
    answers = []
    for _ in range(2):
        answer: Any
        if stream:
            chunks = [
                chunk
                async for chunk in await client.aio.models.generate_content_stream(
                    model="gemini-x", contents=contents, config=config
                )
            ]
            answer = chunks[-1]
            text = "".join(_text(c) for c in chunks)
        else:
            answer = await client.aio.models.generate_content(
                model="gemini-x", contents=contents, config=config
            )
            text = _text(answer)
        answers.append((answer, text))
        calls = answer.function_calls or []
        if not calls:
            break
        contents += [
            answer.candidates[0].content,
            types.Content(role="user", parts=[types.Part.from_function_response(
                name=calls[0].name, response={"output": "a.py"})]),
        ]  # fmt: skip
    return answers


def _text(answer: Any) -> str:
    parts = answer.candidates[0].content.parts or [] if answer.candidates else []
    return "".join(part.text or "" for part in parts)


def _said(api: str, answer: Any) -> tuple[bool, str]:
    """Whether an answer asks for a call, and its text."""
    if api == "anthropic":
        text = "".join(block.text for block in answer.content if block.type == "text")
        return any(b.type == "tool_use" for b in answer.content), text
    if api == "chat":
        message = answer.choices[0].message
        return bool(message.tool_calls), message.content or ""
    if api == "responses":
        return any(item.type == "function_call" for item in answer.output), answer.output_text
    response, text = answer
    return bool(response.function_calls), text


LOOPS = {
    "anthropic": anthropic_loop,
    "chat": chat_loop,
    "responses": responses_loop,
    "gemini": gemini_loop,
}


@pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("api", sorted(LOOPS))
async def test_the_answer_that_would_pass_the_cap_is_replaced_by_the_stop(
    runaway: Runaway, api: str, stream: bool
) -> None:
    async for running in served(runaway):
        answers = await LOOPS[api](running.port, stream)
    asked = [_said(api, answer) for answer in answers]
    assert len(asked) == 2
    assert asked[0][0]  # the first call went through as it came
    assert not asked[1][0]  # the second answer asks for nothing...
    assert asked[1][1].startswith(STOP)  # ...and says why
    if api == "anthropic":
        assert answers[1].stop_reason == "end_turn"
    elif api == "chat":
        assert answers[1].choices[0].finish_reason == "stop"
    assert runaway.calls_made == 2  # the upstream asked twice; the client ran one


@pytest.mark.parametrize("api", ["anthropic", "chat"])
async def test_a_stopped_stream_names_the_plugin_in_its_headers(runaway: Runaway, api: str) -> None:
    """The answer is held from its first call block, so its headers can still say
    ``x-guardstack-stopped`` when the stop comes before any content."""
    import httpx

    path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
    tools: Any = (
        [{"name": TOOL, "input_schema": {"type": "object"}}]
        if api == "anthropic"
        else [{"type": "function", "function": {"name": TOOL, "parameters": {}}}]
    )
    body: dict[str, Any] = {"model": "m", "max_tokens": 50, "stream": True, "tools": tools,
                            "messages": [{"role": "user", "content": "List."}]}  # fmt: skip
    async for running in served(runaway):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.port}") as raw:
            first = await raw.post(path, json=body)
            second_body = {**body, "messages": [*body["messages"], *_continued(api, first.text)]}
            second = await raw.post(path, json=second_body)
    assert "x-guardstack-stopped" not in first.headers
    assert second.headers["x-guardstack-stopped"] == "tool-call-limit"
    assert "x-guardstack-overhead-ms" in second.headers


def _continued(api: str, stream: str) -> list[Any]:
    """The assistant turn a stream carried, and its call's result."""
    events = [json.loads(line[5:]) for line in stream.splitlines() if line.startswith("data: {")]
    if api == "anthropic":
        start = next(e for e in events if e["type"] == "content_block_start")
        block = {**start["content_block"], "input": {"command": "ls"}}
        return [
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block["id"],
                                          "content": "a.py"}]},
        ]  # fmt: skip
    call = next(
        e["choices"][0]["delta"]["tool_calls"][0]
        for e in events
        if e.get("choices") and e["choices"][0]["delta"].get("tool_calls")
    )
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function",
             "function": {"name": TOOL, "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "a.py"},
    ]  # fmt: skip
