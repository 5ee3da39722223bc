"""Stop at the answer that asks: the model's answer, read for the tool calls it asks for
before the agent runs them.

A cap or a loop denial that a tool call would pass is decided on the answer that asks
for the call (``decide``), not on the next request, which carries the call's result
after it ran: so ``tool-call-limit {per_turn: N}`` means N executions. When the
decision is a stop, the tool calls are taken out of the answer and the stop's text put
in their place, with the API's own "the turn is over" ending, so the agent runs nothing
and ends its turn with the stop as the model's last words.

* **JSON**: the body is read whole anyway; its calls are decided and, on a stop, the
  body is written again without them.
* **SSE**: events stream as they come — text first of all — until the first tool-call
  block of the answer begins; from there the answer is held to its end (the calls are
  complete only then), decided, and either released as it came or replaced by a text
  block with the stop and the API's ending events. Holding costs text nothing: only
  what follows a tool call waits, and that is at most the rest of one answer.

Each API's editor (``Editor``) knows where its calls are: Messages' ``tool_use``
blocks, chat completions' ``tool_calls`` deltas, Responses' ``function_call`` (and
``custom_tool_call``) items, Gemini's ``functionCall`` parts.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

__all__ = ["Asked", "Decide", "Editor", "edit_json", "editor_for"]

#: A tool call an answer asks for: ``(call id, tool name, arguments)``.
Asked = tuple[str, str, Any]
#: Decides an answer's calls: the stop's text, or ``None`` to let them run.
Decide = Callable[[list[Asked]], Awaitable[str | None]]


def _arguments(text: Any) -> Any:
    if isinstance(text, dict):
        return text
    if not isinstance(text, str) or not text.strip():
        return {}
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def sse(event: str | None, data: Any) -> bytes:
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


# -- JSON answers ----------------------------------------------------------------------


def asked_in_json(wire: str, data: Mapping[str, Any], turn: int = 0) -> list[Asked]:
    """The tool calls a whole answer asks for."""
    found: list[Asked] = []
    if wire == "anthropic":
        for block in data.get("content") or ():
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                found.append(
                    (str(block.get("id")), str(block.get("name")), block.get("input") or {})
                )
    elif wire == "openai":
        for choice in (data.get("choices") or ())[:1]:
            message = choice.get("message") if isinstance(choice, Mapping) else None
            for call in (message or {}).get("tool_calls") or ():
                function = call.get("function") or {}
                found.append((str(call.get("id")), str(function.get("name")),
                              _arguments(function.get("arguments"))))  # fmt: skip
    elif wire == "responses":
        found.extend(_responses_calls(data.get("output") or ()))
    elif wire == "gemini":
        from guardstack.gateway.model_proxy.gemini import GEMINI

        found.extend(GEMINI.asked(data, turn))
    return found


def _responses_calls(output: Any) -> list[Asked]:
    found: list[Asked] = []
    for item in output:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "function_call":
            found.append((str(item.get("call_id")), str(item.get("name")),
                          _arguments(item.get("arguments"))))  # fmt: skip
        elif item.get("type") == "custom_tool_call":
            found.append((str(item.get("call_id")), str(item.get("name")),
                          {"input": item.get("input")}))  # fmt: skip
    return found


def _message_item(text: str, item_id: str = "msg_guardstack_stop") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _is_call_item(item: Any) -> bool:
    return isinstance(item, Mapping) and item.get("type") in ("function_call", "custom_tool_call")


def stopped_json(wire: str, data: dict[str, Any], text: str) -> dict[str, Any]:
    """The answer with its tool calls taken out and the stop's text in their place."""
    if wire == "anthropic":
        kept = [b for b in data.get("content") or () if not (isinstance(b, Mapping)
                and b.get("type") == "tool_use")]  # fmt: skip
        return {**data, "content": [*kept, {"type": "text", "text": text}],
                "stop_reason": "end_turn"}  # fmt: skip
    if wire == "openai":
        choices = list(data.get("choices") or [])
        if choices:
            choice = dict(choices[0])
            message = dict(choice.get("message") or {})
            message.pop("tool_calls", None)
            before = message.get("content") or ""
            message["content"] = f"{before}\n\n{text}" if before else text
            choice["message"], choice["finish_reason"] = message, "stop"
            choices[0] = choice
        return {**data, "choices": choices}
    if wire == "responses":
        output = [item for item in data.get("output") or () if not _is_call_item(item)]
        return {**data, "output": [*output, _message_item(text)]}
    if wire == "gemini":
        candidates = list(data.get("candidates") or [])
        if candidates:
            candidate = dict(candidates[0])
            content = dict(candidate.get("content") or {"role": "model"})
            parts = [p for p in content.get("parts") or () if not (isinstance(p, Mapping)
                     and "functionCall" in p)]  # fmt: skip
            content["parts"] = [*parts, {"text": text}]
            candidate["content"], candidate["finishReason"] = content, "STOP"
            candidates[0] = candidate
        return {**data, "candidates": candidates}
    return data


async def edit_json(
    wire: str, content: bytes, decide: Decide, turn: int = 0
) -> tuple[bytes, str | None]:
    """A JSON answer as the client gets it — as it came, or without its calls and with
    the stop's text when the decision is a stop — and the stop's text, if any."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return content, None
    if not isinstance(data, dict):
        return content, None
    asked = asked_in_json(wire, data, turn)
    if not asked:
        return content, None
    stop = await decide(asked)
    if stop is None:
        return content, None
    return json.dumps(stopped_json(wire, data, stop), ensure_ascii=False).encode(), stop


# -- streamed answers ------------------------------------------------------------------


class Editor:
    """A stream's events in, what the client gets out (see the module docstring).

    ``feed(raw, event)`` takes one whole SSE event — its bytes and its JSON (``None``
    when it has none) — and answers the bytes to send now; ``finish()`` what is still
    held when the stream ends."""

    def __init__(self, decide: Decide, turn: int = 0) -> None:
        self.decide = decide
        #: Which of the model's answers this is (Gemini's id-less calls are named by it).
        self.turn = turn
        self.held: list[tuple[bytes, Any]] = []
        self.holding = False
        self.stopped = False
        #: The stop's text, once a decision stopped the answer.
        self.stop: str | None = None
        #: Events before the answer's first content (its start, a ping): held until
        #: that content shows whether the answer opens with a call — so a stop can
        #: still be named in the response's headers. Text costs nothing: its first
        #: delta comes right behind them.
        self.preamble: list[bytes] = []

    async def feed(self, raw: bytes, event: Any) -> bytes:
        return raw

    def _opened(self, raw: bytes) -> bytes:
        """The held preamble and ``raw``: the answer's first content is not a call."""
        preamble, self.preamble = self.preamble, []
        return b"".join([*preamble, raw])

    def _stopping(self, stop: str) -> None:
        self.stopped, self.stop = True, stop
        self.held, self.holding = [], False

    async def finish(self) -> bytes:
        held, self.held, self.holding = self.held, [], False
        preamble, self.preamble = self.preamble, []
        return b"".join([*preamble, *(raw for raw, _ in held)])

    def _release(self) -> bytes:
        held, self.held, self.holding = self.held, [], False
        preamble, self.preamble = self.preamble, []
        return b"".join([*preamble, *(raw for raw, _ in held)])


class _Anthropic(Editor):
    """Holds from the first ``tool_use`` block to the message's end."""

    opened = False

    async def feed(self, raw: bytes, event: Any) -> bytes:
        kind = event.get("type") if isinstance(event, Mapping) else None
        if self.stopped:
            if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
                return b""
            if kind == "message_delta":
                delta = {**(event.get("delta") or {}), "stop_reason": "end_turn"}
                return sse("message_delta", {**event, "delta": delta})
            return raw
        if not self.holding:
            block = event.get("content_block") if kind == "content_block_start" else None
            if kind in ("message_start", "ping") and not self.opened:
                self.preamble.append(raw)
                return b""
            if not (isinstance(block, Mapping) and block.get("type") == "tool_use"):
                self.opened = True
                return self._opened(raw)
            self.opened = True
            self.holding = True
        self.held.append((raw, event))
        if kind not in ("message_delta", "message_stop"):
            return b""
        return await self._decided()

    async def _decided(self) -> bytes:
        calls: dict[int, list[Any]] = {}
        first: int | None = None
        for _, event in self.held:
            if not isinstance(event, Mapping):
                continue
            index = event.get("index")
            if event.get("type") == "content_block_start":
                block = event.get("content_block") or {}
                if block.get("type") == "tool_use" and isinstance(index, int):
                    calls[index] = [
                        str(block.get("id")),
                        str(block.get("name")),
                        block.get("input") or {},
                        "",
                    ]
                    first = index if first is None else first
            elif event.get("type") == "content_block_delta" and index in calls:
                delta = event.get("delta") or {}
                if delta.get("type") == "input_json_delta":
                    calls[index][3] += str(delta.get("partial_json", ""))
        asked = [(c[0], c[1], _arguments(c[3]) if c[3] else c[2]) for c in calls.values()]
        stop = await self.decide(asked) if asked else None
        if stop is None:
            return self._release()
        ending = [(raw, event) for raw, event in self.held if isinstance(event, Mapping)
                  and event.get("type") in ("message_delta", "message_stop")]  # fmt: skip
        self._stopping(stop)
        index = first if first is not None else 0
        out = [
            self._opened(b""),
            sse("content_block_start", {"type": "content_block_start", "index": index,
                                        "content_block": {"type": "text", "text": ""}}),
            sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                        "delta": {"type": "text_delta", "text": stop}}),
            sse("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]  # fmt: skip
        for raw, event in ending:
            out.append(await self.feed(raw, event))
        return b"".join(out)


class _Chat(Editor):
    """Holds from the first ``tool_calls`` delta to the choice's ``finish_reason``."""

    opened = False

    async def feed(self, raw: bytes, event: Any) -> bytes:
        choices = event.get("choices") if isinstance(event, Mapping) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        if self.stopped:
            return b"" if isinstance(choice, Mapping) else raw  # later choice chunks dropped
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if not self.holding:
            if not (isinstance(delta, Mapping) and delta.get("tool_calls")):
                role_only = isinstance(delta, Mapping) and not delta.get("content")
                finished = isinstance(choice, Mapping) and choice.get("finish_reason")
                if not self.opened and role_only and not finished:
                    self.preamble.append(raw)  # the role alone: no content yet
                    return b""
                self.opened = True
                return self._opened(raw)
            self.opened = True
            self.holding = True
        self.held.append((raw, event))
        if not (isinstance(choice, Mapping) and choice.get("finish_reason")):
            return b""
        calls: dict[int, list[str]] = {}
        for _, held in self.held:
            for piece in ((held.get("choices") or [{}])[0].get("delta") or {}).get(
                "tool_calls"
            ) or ():
                index = piece.get("index", 0)
                entry = calls.setdefault(index, ["", "", ""])
                function = piece.get("function") or {}
                entry[0] = piece.get("id") or entry[0]
                entry[1] = function.get("name") or entry[1]
                entry[2] += function.get("arguments") or ""
        asked = [(c[0], c[1], _arguments(c[2])) for c in calls.values()]
        stop = await self.decide(asked)
        if stop is None:
            return self._release()
        self._stopping(stop)
        model_chunk = {k: v for k, v in event.items() if k in ("id", "object", "created", "model")}
        replaced = {**model_chunk, "choices": [{"index": 0, "delta": {"role": "assistant",
                    "content": stop}, "finish_reason": "stop"}]}  # fmt: skip
        return self._opened(sse(None, replaced))


class _Responses(Editor):
    """Holds from the first call item to ``response.completed``."""

    def __init__(self, decide: Decide, turn: int = 0) -> None:
        super().__init__(decide, turn)
        self.number = 0
        self.opened = False

    async def feed(self, raw: bytes, event: Any) -> bytes:
        kind = event.get("type") if isinstance(event, Mapping) else None
        if isinstance(event, Mapping) and isinstance(event.get("sequence_number"), int):
            self.number = max(self.number, event["sequence_number"])
        if not self.holding:
            if kind in ("response.created", "response.in_progress") and not self.opened:
                self.preamble.append(raw)
                return b""
            self.opened = True
            if not (kind == "response.output_item.added" and _is_call_item(event.get("item"))):
                return self._opened(raw)
            self.holding = True
        self.held.append((raw, event))
        if kind not in ("response.completed", "response.incomplete", "response.failed"):
            return b""
        response = event.get("response") or {}
        asked = _responses_calls(response.get("output") or ())
        stop = await self.decide(asked) if asked and kind == "response.completed" else None
        if stop is None:
            return self._release()
        self._stopping(stop)
        output = [item for item in response.get("output") or () if not _is_call_item(item)]
        index = len(output)
        item = _message_item(stop)
        part = item["content"][0]
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        added = {**item, "status": "in_progress", "content": []}
        events = [
            ("response.output_item.added", {"output_index": index, "item": added}),
            ("response.content_part.added", {**ids, "part": {**part, "text": ""}}),
            ("response.output_text.delta", {**ids, "delta": stop, "logprobs": []}),
            ("response.output_text.done", {**ids, "text": stop, "logprobs": []}),
            ("response.content_part.done", {**ids, "part": part}),
            ("response.output_item.done", {"output_index": index, "item": item}),
            ("response.completed", {"response": {**response, "output": [*output, item]}}),
        ]
        out = [self._opened(b"")]
        for name, payload in events:
            self.number += 1
            out.append(sse(name, {"type": name, "sequence_number": self.number, **payload}))
        return b"".join(out)


class _Gemini(Editor):
    """Each chunk is whole: its function calls are decided as it comes."""

    async def feed(self, raw: bytes, event: Any) -> bytes:
        if not isinstance(event, dict):
            return raw
        from guardstack.gateway.model_proxy.gemini import GEMINI

        asked = GEMINI.asked(event, self.turn)
        if not asked:
            return raw
        stop = "" if self.stopped else await self.decide(asked)
        if stop is None:
            return raw
        if self.stopped:  # calls after a stop: dropped, their chunk's text kept
            return sse(None, stopped_json("gemini", event, "")) if _has_text(event) else b""
        self._stopping(stop)
        return sse(None, stopped_json("gemini", event, stop))


def _has_text(event: Mapping[str, Any]) -> bool:
    for candidate in event.get("candidates") or ():
        for part in (candidate.get("content") or {}).get("parts") or ():
            if isinstance(part, Mapping) and part.get("text"):
                return True
    return False


def editor_for(wire: str, decide: Decide, turn: int = 0) -> Editor:
    editors: dict[str, type[Editor]] = {
        "anthropic": _Anthropic,
        "openai": _Chat,
        "responses": _Responses,
        "gemini": _Gemini,
    }
    return editors.get(wire, Editor)(decide, turn)
