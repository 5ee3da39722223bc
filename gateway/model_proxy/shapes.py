"""What each provider API types in a request, and one walk that checks a body against it.

A request is forwarded only when every field the provider types has the type the
provider accepts: ``{"type": "text", "text": 5}``, ``tools: [1]`` or ``max_tokens:
10**400`` are the client's error (400, in the API's own shape) and never reach the
upstream under the provider's key. The shapes name the fields the providers' own
schemas type — not every field they have: a field a shape does not name, a block
type it does not know, and ``null`` for an optional field pass through as they came,
because refusing what the provider accepts breaks real clients (Claude Code sends
``{"role": "system"}`` items inside ``messages``; Anthropic accepts them).

A shape is a ``Shape``: the JSON kinds a value may be (``text``, ``int``, ``number``,
``bool``, ``object``, ``list``), the shapes of an object's fields (and which of them
it must have), the shape of a list's items, and — for a list of blocks or items that
say their ``type`` — the shape of each type it knows (another type: only the
object's common fields are checked). Whole numbers are bounded as the providers'
are (64-bit), so a number no provider can read is refused here rather than
overflowing a price later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["Shape", "conform", "fields", "items", "one_of", "typed"]

#: The largest whole number a provider's schema accepts (a signed 64-bit integer).
MAX_INT: Final = 2**63 - 1

_NAMES: Final = {
    "text": "text",
    "int": "a whole number",
    "number": "a number",
    "bool": "true or false",
    "object": "an object",
    "list": "a list",
}


class Shape:
    """The kinds a value may be; an object's fields and a list's items, when typed."""

    __slots__ = ("default", "fields", "items", "kinds", "minimum", "required", "variants")

    def __init__(
        self,
        *kinds: str,
        fields: Mapping[str, Shape] | None = None,
        required: tuple[str, ...] = (),
        items: Shape | None = None,
        minimum: float | None = None,
        variants: Mapping[str, Shape] | None = None,
        default: str | None = None,
    ) -> None:
        self.kinds = frozenset(kinds)
        self.fields = dict(fields or {})
        self.required = required
        self.items = items
        self.minimum = minimum
        #: An object's shape by its ``type`` (``default``: the type when it says none).
        self.variants = dict(variants or {})
        self.default = default

    def describe(self) -> str:
        names = [_NAMES[kind] for kind in sorted(self.kinds)]
        said = " or ".join(names)
        if self.minimum is not None:
            said += f" of at least {self.minimum:g}"
        return said


def fields(*kinds: str, required: tuple[str, ...] = (), **named: Shape) -> Shape:
    """An object (or ``kinds``) whose named fields have the shapes given."""
    return Shape("object", *kinds, fields=named, required=required)


def typed(common: Shape, default: str | None = None, **variants: Shape) -> Shape:
    """An object whose shape depends on its ``type``: ``common``'s fields always, and
    those of the variant its type names (``default`` when it names none)."""
    return Shape(
        "object",
        *(common.kinds - {"object"}),
        fields=common.fields,
        required=common.required,
        variants=variants,
        default=default,
    )


def items(shape: Shape, *kinds: str) -> Shape:
    """A list (or ``kinds``) whose every item has ``shape``."""
    return Shape("list", *kinds, items=shape)


def one_of(*kinds: str, minimum: float | None = None) -> Shape:
    return Shape(*kinds, minimum=minimum)


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "text"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "list"
    return None


def _fits(value: Any, shape: Shape) -> bool:
    kind = _kind(value)
    kinds = shape.kinds
    if kind == "int":
        if "int" not in kinds and "number" not in kinds:
            return False
        if not -MAX_INT - 1 <= value <= MAX_INT:
            return False
    elif kind == "number":
        if "number" not in kinds or not math.isfinite(value):
            return False
    elif kind not in kinds:
        return False
    return shape.minimum is None or kind not in ("int", "number") or value >= shape.minimum


def conform(data: Any, shape: Shape, where: str = "") -> str | None:
    """Where ``data`` first differs from ``shape`` and what it must be, or ``None``.

    Walks without recursion (a body is already bounded in depth by the parser)."""
    stack: list[tuple[Any, Shape, str]] = [(data, shape, where)]
    while stack:
        value, expected, at = stack.pop()
        if not _fits(value, expected):
            return f"{at or 'the body'} must be {expected.describe()}"
        if isinstance(value, dict):
            shapes = [expected]
            if expected.variants:
                kind = value.get("type", expected.default)
                variant = expected.variants.get(kind) if isinstance(kind, str) else None
                if variant is not None:
                    shapes.append(variant)
            for each in shapes:
                for name in each.required:
                    if value.get(name) is None:
                        named = f"{at}.{name}" if at else name
                        return f"{named} must be {each.fields[name].describe()}"
                for name, field in each.fields.items():
                    found = value.get(name)
                    if found is not None:
                        stack.append((found, field, f"{at}.{name}" if at else name))
        elif isinstance(value, list) and expected.items is not None:
            for index in range(len(value) - 1, -1, -1):
                stack.append((value[index], expected.items, f"{at}[{index}]"))
    return None


# -- the building blocks the providers share -------------------------------------------

TEXT: Final = one_of("text")
INT: Final = one_of("int")
COUNT: Final = one_of("int", minimum=1)
NUMBER: Final = one_of("int", "number")
BOOL: Final = one_of("bool")
OBJECT: Final = one_of("object")
TEXTS: Final = items(TEXT)


# -- OpenAI chat completions -----------------------------------------------------------

_CHAT_PART: Final = typed(
    fields(type=TEXT),
    text=fields(text=TEXT, required=("text",)),
    image_url=fields(image_url=fields("text", url=TEXT, detail=TEXT)),
    refusal=fields(refusal=TEXT),
)
_CHAT_CALL: Final = fields(
    id=TEXT,
    type=TEXT,
    function=fields(name=TEXT, arguments=TEXT, required=("name",)),
    required=("function",),
)
CHAT: Final = fields(
    model=TEXT,
    messages=items(
        fields(
            role=TEXT,
            content=items(_CHAT_PART, "text"),
            name=TEXT,
            tool_calls=items(_CHAT_CALL),
            tool_call_id=TEXT,
            refusal=TEXT,
            required=("role",),
        )
    ),
    tools=items(
        fields(
            type=TEXT,
            function=fields(name=TEXT, description=TEXT, parameters=OBJECT, strict=BOOL),
        )
    ),
    tool_choice=fields("text", type=TEXT),
    parallel_tool_calls=BOOL,
    stream=BOOL,
    stream_options=fields(include_usage=BOOL),
    max_tokens=COUNT,
    max_completion_tokens=COUNT,
    n=COUNT,
    temperature=NUMBER,
    top_p=NUMBER,
    presence_penalty=NUMBER,
    frequency_penalty=NUMBER,
    seed=INT,
    stop=items(TEXT, "text"),
    user=TEXT,
    logprobs=BOOL,
    top_logprobs=INT,
    logit_bias=OBJECT,
    response_format=fields(type=TEXT),
    metadata=OBJECT,
    store=BOOL,
    reasoning_effort=TEXT,
    prompt_cache_key=TEXT,
    required=("model", "messages"),
)

# -- Anthropic Messages ----------------------------------------------------------------

_ANTHROPIC_TEXT: Final = fields(text=TEXT, required=("text",))
_ANTHROPIC_INNER: Final = typed(fields(type=TEXT, required=("type",)), text=_ANTHROPIC_TEXT)
ANTHROPIC_BLOCK: Final = typed(
    fields(type=TEXT, cache_control=fields(type=TEXT), required=("type",)),
    text=_ANTHROPIC_TEXT,
    tool_use=fields(id=TEXT, name=TEXT, input=OBJECT, required=("id", "name")),
    server_tool_use=fields(id=TEXT, name=TEXT, input=OBJECT),
    tool_result=fields(
        tool_use_id=TEXT,
        content=items(_ANTHROPIC_INNER, "text"),
        is_error=BOOL,
        required=("tool_use_id",),
    ),
    thinking=fields(thinking=TEXT, signature=TEXT),
    redacted_thinking=fields(data=TEXT),
    image=fields(source=OBJECT),
    document=fields(source=OBJECT),
)
MESSAGES: Final = fields(
    model=TEXT,
    max_tokens=COUNT,
    messages=items(
        fields(role=TEXT, content=items(ANTHROPIC_BLOCK, "text"), required=("role", "content"))
    ),
    system=items(ANTHROPIC_BLOCK, "text"),
    tools=items(
        fields(type=TEXT, name=TEXT, description=TEXT, input_schema=OBJECT, cache_control=OBJECT)
    ),
    tool_choice=fields(type=TEXT, name=TEXT),
    stream=BOOL,
    temperature=NUMBER,
    top_p=NUMBER,
    top_k=INT,
    stop_sequences=TEXTS,
    metadata=fields(user_id=TEXT),
    thinking=fields(type=TEXT, budget_tokens=INT),
    required=("model", "max_tokens", "messages"),
)

# -- OpenAI Responses ------------------------------------------------------------------

_RESPONSES_PART: Final = typed(
    fields(type=TEXT),
    input_text=fields(text=TEXT, required=("text",)),
    output_text=fields(text=TEXT, required=("text",)),
    input_image=fields(image_url=TEXT, file_id=TEXT, detail=TEXT),
)
_RESPONSES_ITEM: Final = typed(
    fields(type=TEXT, id=TEXT),
    "message",
    message=fields(role=TEXT, content=items(_RESPONSES_PART, "text"), required=("role", "content")),
    function_call=fields(call_id=TEXT, name=TEXT, arguments=TEXT, required=("call_id", "name")),
    function_call_output=fields(
        call_id=TEXT, output=items(_RESPONSES_PART, "text"), required=("call_id", "output")
    ),
)
RESPONSES: Final = fields(
    model=TEXT,
    input=items(_RESPONSES_ITEM, "text"),
    instructions=TEXT,
    previous_response_id=TEXT,
    tools=items(fields(type=TEXT, name=TEXT, description=TEXT, parameters=OBJECT, strict=BOOL)),
    tool_choice=fields("text", type=TEXT),
    parallel_tool_calls=BOOL,
    stream=BOOL,
    store=BOOL,
    max_output_tokens=COUNT,
    max_tool_calls=COUNT,
    temperature=NUMBER,
    top_p=NUMBER,
    include=TEXTS,
    reasoning=fields(effort=TEXT, summary=TEXT),
    text=OBJECT,
    metadata=OBJECT,
    prompt_cache_key=TEXT,
    user=TEXT,
    required=("model", "input"),
)

# -- the Gemini API --------------------------------------------------------------------

_GEMINI_PART: Final = fields(
    text=TEXT,
    thought=BOOL,
    thoughtSignature=TEXT,
    functionCall=fields(name=TEXT, args=OBJECT, id=TEXT, required=("name",)),
    functionResponse=fields(name=TEXT, response=OBJECT, id=TEXT, required=("name",)),
    inlineData=fields(mimeType=TEXT, data=TEXT),
    fileData=fields(mimeType=TEXT, fileUri=TEXT),
)
_GEMINI_CONTENT: Final = fields(role=TEXT, parts=items(_GEMINI_PART))
GEMINI: Final = fields(
    contents=items(_GEMINI_CONTENT),
    systemInstruction=_GEMINI_CONTENT,
    tools=items(
        fields(
            functionDeclarations=items(
                fields(name=TEXT, description=TEXT, parameters=OBJECT,
                       parametersJsonSchema=OBJECT, required=("name",))
            )
        )
    ),
    toolConfig=OBJECT,
    safetySettings=items(OBJECT),
    generationConfig=fields(
        maxOutputTokens=COUNT,
        temperature=NUMBER,
        topP=NUMBER,
        topK=NUMBER,
        candidateCount=COUNT,
        stopSequences=TEXTS,
        responseMimeType=TEXT,
        thinkingConfig=fields(includeThoughts=BOOL, thinkingBudget=INT, thinkingLevel=TEXT),
    ),
    cachedContent=TEXT,
    required=("contents",),
)  # fmt: skip
