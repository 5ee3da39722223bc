"""Ending a stream the proxy stops partway: the events a client needs to see a clean end.

When a guard stops an answer that is already streaming to the client — a loop inside
its text (``LoopDetector(text=True)``) cut mid-answer — the upstream's own ending never
comes. ``Closing`` watches the events that went out, so it can end the message as the
API ends one: the block or item in progress closed, the stop's text as one more piece
of the answer, then the API's "the answer is complete" events (chat completions: a last
chunk with ``finish_reason: stop`` and ``[DONE]``; Messages: ``message_delta`` with
``stop_reason: end_turn`` and ``message_stop``; Responses: the item done and
``response.completed``; Gemini: a last chunk with ``finishReason: STOP``). Never
half-written JSON: only whole events ever went out before it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["Closing", "closing_for"]


def _sse(event: str | None, data: Any) -> bytes:
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class Closing:
    """What went out of one stream, and how to end it (the base: nothing to add)."""

    def see(self, event: Any) -> None:
        """One whole event that went out to the client."""

    def close(self, text: str) -> bytes:
        """The events that end the answer with ``text`` as its last words."""
        return b""


class _Chat(Closing):
    def __init__(self) -> None:
        self.head: dict[str, Any] = {"object": "chat.completion.chunk"}

    def see(self, event: Any) -> None:
        if isinstance(event, Mapping):
            for key in ("id", "created", "model", "system_fingerprint"):
                if key in event:
                    self.head[key] = event[key]

    def close(self, text: str) -> bytes:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": "stop"}
        return _sse(None, {**self.head, "choices": [choice]}) + b"data: [DONE]\n\n"


class _Anthropic(Closing):
    def __init__(self) -> None:
        self.open: int | None = None
        self.next = 0

    def see(self, event: Any) -> None:
        if not isinstance(event, Mapping):
            return
        index = event.get("index")
        if event.get("type") == "content_block_start" and isinstance(index, int):
            self.open, self.next = index, max(self.next, index + 1)
        elif event.get("type") == "content_block_stop" and index == self.open:
            self.open = None

    def close(self, text: str) -> bytes:
        out = []
        if self.open is not None:
            out.append(
                _sse("content_block_stop", {"type": "content_block_stop", "index": self.open})
            )
        index = self.next
        out += [
            _sse("content_block_start", {"type": "content_block_start", "index": index,
                                         "content_block": {"type": "text", "text": ""}}),
            _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": "text_delta", "text": text}}),
            _sse("content_block_stop", {"type": "content_block_stop", "index": index}),
            _sse("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                   "usage": {"output_tokens": 0}}),
            _sse("message_stop", {"type": "message_stop"}),
        ]  # fmt: skip
        return b"".join(out)


class _Responses(Closing):
    def __init__(self) -> None:
        self.response: dict[str, Any] = {"object": "response", "output": []}
        self.number = 0
        self.done: list[Any] = []
        #: The message item in progress: its id, place, and text so far.
        self.item: dict[str, Any] | None = None
        self.index = 0
        self.text = ""

    def see(self, event: Any) -> None:
        if not isinstance(event, Mapping):
            return
        if isinstance(event.get("sequence_number"), int):
            self.number = max(self.number, event["sequence_number"])
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress"):
            response = event.get("response")
            if isinstance(response, Mapping):
                self.response = dict(response)
        elif kind == "response.output_item.added":
            item = event.get("item")
            if isinstance(item, Mapping) and item.get("type") == "message":
                self.item, self.text = dict(item), ""
                self.index = int(event.get("output_index") or 0)
        elif kind == "response.output_text.delta":
            self.text += str(event.get("delta") or "")
        elif kind == "response.output_item.done":
            self.done.append(event.get("item"))
            item = event.get("item")
            if isinstance(item, Mapping) and self.item and item.get("id") == self.item.get("id"):
                self.item = None

    def _event(self, name: str, payload: dict[str, Any]) -> bytes:
        self.number += 1
        return _sse(name, {"type": name, "sequence_number": self.number, **payload})

    def close(self, text: str) -> bytes:
        out = []
        if self.item is None:  # no message in progress: one more, holding the text
            self.index = len(self.done)
            self.item = {"id": "msg_guardstack_stop", "type": "message", "role": "assistant",
                         "status": "in_progress", "content": []}  # fmt: skip
            self.text = ""
            out.append(self._event("response.output_item.added",
                                   {"output_index": self.index, "item": self.item}))  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": []}
            ids = {"item_id": self.item["id"], "output_index": self.index, "content_index": 0}
            out.append(self._event("response.content_part.added", {**ids, "part": part}))
        ids = {"item_id": self.item["id"], "output_index": self.index, "content_index": 0}
        whole = self.text + text
        part = {"type": "output_text", "text": whole, "annotations": []}
        item = {**self.item, "status": "completed", "content": [part]}
        out += [
            self._event("response.output_text.delta", {**ids, "delta": text, "logprobs": []}),
            self._event("response.output_text.done", {**ids, "text": whole, "logprobs": []}),
            self._event("response.content_part.done", {**ids, "part": part}),
            self._event("response.output_item.done", {"output_index": self.index, "item": item}),
        ]
        response = {**self.response, "status": "completed", "output": [*self.done, item]}
        out.append(self._event("response.completed", {"response": response}))
        return b"".join(out)


class _Gemini(Closing):
    def __init__(self) -> None:
        self.model: Any = None

    def see(self, event: Any) -> None:
        if isinstance(event, Mapping) and event.get("modelVersion"):
            self.model = event["modelVersion"]

    def close(self, text: str) -> bytes:
        candidate = {"content": {"parts": [{"text": text}], "role": "model"},
                     "finishReason": "STOP", "index": 0}  # fmt: skip
        chunk: dict[str, Any] = {"candidates": [candidate]}
        if self.model is not None:
            chunk["modelVersion"] = self.model
        return _sse(None, chunk).replace(b"\n\n", b"\r\n\r\n")


def closing_for(wire: str) -> Closing:
    kinds: dict[str, type[Closing]] = {
        "openai": _Chat, "anthropic": _Anthropic, "responses": _Responses, "gemini": _Gemini,
    }  # fmt: skip
    return kinds.get(wire, Closing)()
