"""The Gemini API through the proxy (Gemini CLI, Google's SDKs, ADK): JSON and SSE.

``POST /v1beta/models/{model}:generateContent`` answers one ``GenerateContentResponse``;
``:streamGenerateContent?alt=sse`` a stream of them, each a ``data:`` line. The client
key comes in ``x-goog-api-key`` or ``?key=``; the upstream gets the proxy's own key in
``x-goog-api-key`` and never the client's. The history is ``contents``: the model's
``functionCall`` parts are the tool calls and the user's ``functionResponse`` parts
their results (paired by ``id``, else by name in order); ``usageMetadata`` is the
usage (the thoughts are output the provider bills, and the reasoning tokens); a
reminder is a text part added to the last user content; a stop is a candidate with one
text part and ``finishReason: "STOP"``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

from guardstack.gateway.model_proxy import shapes
from guardstack.gateway.model_proxy.wires import Wire, _unknown, conformed, positive_int
from guardstack.integrations._provider import usage_reported
from guardstack.pipeline import ModelReply, Usage

__all__ = ["GEMINI", "Gemini"]

#: The Gemini API's status names for the statuses the proxy answers.
_STATUS: Final = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _parts(content: Any) -> list[Mapping[str, Any]]:
    parts = content.get("parts") if isinstance(content, Mapping) else None
    return [part for part in parts if isinstance(part, Mapping)] if isinstance(parts, list) else []


def gemini_usage(reported: Any) -> Usage | None:
    """``usageMetadata`` as guardstack counts it: the thoughts are output (and its
    reasoning tokens), the cached content is input already counted in the prompt, a
    tool's prompt (``toolUsePromptTokenCount``) is input too."""
    if not isinstance(reported, Mapping):
        return usage_reported(None, None, source="the upstream (no usageMetadata)")
    thoughts = reported.get("thoughtsTokenCount") or 0
    candidates = reported.get("candidatesTokenCount") or 0
    prompt, tool_use = reported.get("promptTokenCount"), reported.get("toolUsePromptTokenCount")
    return usage_reported(
        # a tool's prompt (search grounding's results) is input the API bills as such
        prompt + tool_use
        if isinstance(prompt, int) and isinstance(tool_use, int) and tool_use > 0
        else prompt,
        candidates + thoughts
        if isinstance(candidates, int) and isinstance(thoughts, int)
        else None,
        cached_input_tokens=reported.get("cachedContentTokenCount"),
        reasoning_tokens=thoughts if isinstance(thoughts, int) else None,
        source="the upstream",
    )


class Gemini(Wire):
    """The Gemini API (see the module docstring)."""

    name, path = "gemini", "/v1beta/models"
    history = "contents"
    tool_fields = ("tools", "toolConfig")
    input_fields = ("systemInstruction", "contents", "tools", "toolConfig")

    def asks_structured(self, data: Mapping[str, Any]) -> bool:
        config = data.get("generationConfig")
        if not isinstance(config, Mapping):
            return False
        return config.get("responseMimeType") == "application/json" or any(
            key in config for key in ("responseSchema", "responseJsonSchema")
        )

    def choices(self, data: Mapping[str, Any]) -> int:
        config = data.get("generationConfig")
        count = positive_int(config.get("candidateCount")) if isinstance(config, Mapping) else None
        return count or 1

    def wrap_up(self, data: dict[str, Any], note: str, tokens: int) -> dict[str, Any]:
        kept = {k: v for k, v in data.items() if k not in self.tool_fields}
        config = dict(kept.get("generationConfig") or {})
        config["maxOutputTokens"] = tokens
        kept["generationConfig"] = config
        return self.remind(kept, [note])

    def check(self, data: dict[str, Any]) -> None:
        conformed(data, shapes.GEMINI)

    def headers(self, key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if key:
            headers["x-goog-api-key"] = key
        return headers

    def model(self, data: Mapping[str, Any]) -> str | None:
        model = data.get("model")  # the route puts the path's model here
        return model if isinstance(model, str) and model else None

    def max_tokens(self, data: Mapping[str, Any]) -> int | None:
        config = data.get("generationConfig")
        return positive_int(config.get("maxOutputTokens")) if isinstance(config, Mapping) else None

    def system_text(self, data: Mapping[str, Any], messages: list[Any]) -> str:
        return "".join(str(part.get("text", "")) for part in _parts(data.get("systemInstruction")))

    def calls(self, messages: list[Any]) -> Iterator[tuple[str, str, Any, str]]:
        answered: dict[str, str] = {}
        by_name: dict[str, list[str]] = {}
        for message in messages:
            for part in _parts(message):
                response = part.get("functionResponse")
                if isinstance(response, Mapping):
                    text = json.dumps(response.get("response"), ensure_ascii=False, default=str)
                    name = str(response.get("name", ""))
                    if response.get("id"):
                        answered[str(response["id"])] = text
                    else:
                        by_name.setdefault(name, []).append(text)
        turn = 0
        for message in messages:
            if not isinstance(message, Mapping) or message.get("role") != "model":
                continue
            turn += 1
            for number, part in enumerate(_parts(message)):
                call = part.get("functionCall")
                if not isinstance(call, Mapping):
                    continue
                name = str(call.get("name", ""))
                # named by its place, whatever id the client gave it: the answer that
                # asked for it had none yet (Gemini CLI adds its own)
                call_id = _call_id(turn, number, name)
                given = call.get("id")
                if given and str(given) in answered:
                    result = answered[str(given)]
                elif by_name.get(name):
                    result = by_name[name].pop(0)
                else:
                    continue
                arguments = call.get("args") if isinstance(call.get("args"), Mapping) else {}
                yield call_id, name, arguments, result

    def is_prompt(self, message: Mapping[str, Any]) -> bool:
        if message.get("role", "user") != "user":
            return False
        parts = _parts(message)
        return bool(parts) and not any("functionResponse" in part for part in parts)

    def last_prompt(self, messages: list[Any]) -> str:
        if not messages or not self.is_prompt(messages[self.turn_start(messages)]):
            return ""
        return "".join(str(p.get("text", "")) for p in _parts(messages[self.turn_start(messages)]))

    def remind(self, data: dict[str, Any], reminders: list[str]) -> dict[str, Any]:
        contents = list(data.get("contents") or [])
        texts = [{"text": text} for text in reminders]
        if (
            contents
            and isinstance(contents[-1], Mapping)
            and contents[-1].get("role", "user") == "user"
        ):
            last = dict(contents[-1])
            last["parts"] = [*_parts(last), *texts]
            contents[-1] = last
        else:
            contents.append({"role": "user", "parts": texts})
        return {**data, "contents": contents}

    def user_messages(self, texts: list[str]) -> list[dict[str, Any]]:
        return [{"role": "user", "parts": [{"text": text}]} for text in texts]

    def reply_of(self, content: bytes) -> ModelReply:
        try:
            data = json.loads(content)
            candidate = (data.get("candidates") or [{}])[0]
            text = "".join(
                str(part.get("text", ""))
                for part in _parts(candidate.get("content"))
                if not part.get("thought")
            )
            model = data.get("modelVersion")
        except (ValueError, TypeError, AttributeError, IndexError, RecursionError):
            return ModelReply("", usage=_unknown("an unreadable Gemini answer"))
        return ModelReply(
            text,
            usage=gemini_usage(data.get("usageMetadata")),
            model=model if isinstance(model, str) else None,
        )

    def text_in(self, event: Any) -> str:
        if not isinstance(event, Mapping):
            return ""
        candidates = event.get("candidates")
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        if not isinstance(candidate, Mapping):
            return ""
        return "".join(str(part.get("text", "")) for part in _parts(candidate.get("content")))

    def usage_in(self, event: Mapping[str, Any], so_far: Usage | None) -> Usage | None:
        """Each chunk's ``usageMetadata`` is the stream's so far (the last one whole)."""
        reported = event.get("usageMetadata")
        return gemini_usage(reported) if isinstance(reported, Mapping) else so_far

    def model_turns(self, messages: list[Any]) -> int:
        """How many of the model's answers a history holds (an id-less call's id
        counts them: the answer to this request is the next one)."""
        return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "model")

    def asked(self, data: Mapping[str, Any], turn: int = 0) -> list[tuple[str, str, Any]]:
        """The function calls an answer (or one streamed chunk) asks for; ``turn``: the
        answer's place among the model's (for the id of a call that has none)."""
        found = []
        for candidate in data.get("candidates") or ():
            if not isinstance(candidate, Mapping):
                continue
            for number, part in enumerate(_parts(candidate.get("content"))):
                call = part.get("functionCall")
                if isinstance(call, Mapping):
                    name = str(call.get("name", ""))
                    args = call.get("args") if isinstance(call.get("args"), Mapping) else {}
                    found.append((_call_id(turn, number, name), name, args))
        return found

    def stop_body(self, model: str, text: str) -> dict[str, Any]:
        return {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": text}]},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 0,
                "candidatesTokenCount": 0,
                "totalTokenCount": 0,
            },
            "modelVersion": model,
        }

    def stop_events(self, model: str, text: str) -> list[tuple[str | None, dict[str, Any]]]:
        return [(None, self.stop_body(model, text))]

    def first_prompt(self, messages: list[Any]) -> str:
        for message in messages:
            if isinstance(message, Mapping) and self.is_prompt(message):
                return "".join(str(part.get("text", "")) for part in _parts(message))
        return ""

    def cut_events(self, message: str, response_id: str | None = None) -> bytes:
        error = self.error_body(500, "upstream", message)
        return f"data: {json.dumps(error)}\n\n".encode()

    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        return {
            "error": {
                "code": status,
                "message": message,
                "status": _STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT"),
            }
        }


def _call_id(turn: int, number: int, name: str) -> str:
    """The id the proxy knows a call by: which of the model's answers it is in, its
    place there, its name — alike when asked and when its result comes back, whether or
    not the client gave it an id of its own meanwhile."""
    return f"gemini-{turn}-{number}-{name}"


GEMINI: Final = Gemini()
