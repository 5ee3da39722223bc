"""Tools from functions: the schema from the annotations, the descriptions from the docstring.

``ToolDefinition.from_function(fn)`` (and the ``@tool`` decorator) read a plain or
``async`` function and give the model what it needs to call it well: a JSON Schema
of its parameters built from their annotations — ``str``, ``int``, ``float``,
``bool``, ``None``, ``Literal``, ``Enum``, ``list``, ``dict``, ``tuple``, unions and
``Optional``, ``TypedDict``, dataclasses, and pydantic models when pydantic is
installed — and the description and per-parameter descriptions from a Google- or
Sphinx-style docstring.

Arguments are checked against the annotations before the function runs: a missing,
unknown or wrongly-typed argument is answered ``INVALID_ARGUMENTS`` naming the field
and why (the function is not called), and values are converted to the annotated
types (``Enum`` members, dataclass and pydantic instances, tuples). A parameter
annotated ``ToolCall`` receives the call and is left out of the schema. A signature
the model's arguments cannot fill — positional-only parameters, ``*args``, an
annotation with no JSON form — is refused when the tool is made, naming the
parameter, never at the first call.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, get_args, get_origin

import attrs

from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.values import ToolCall, ToolDefinition, invalid_arguments_result

__all__ = ["from_function", "tool"]

_NONE_TYPE: Final = type(None)


class _Invalid(Exception):
    """An argument that does not fit its annotation: ``where`` is its path."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where
        self.why = why


Convert = Callable[[object, str], object]


@attrs.frozen
class _Field:
    schema: dict[str, Any]
    convert: Convert


def _describe(value: object) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


def _kind(value: object) -> str:
    return {
        str: "text",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _expect(ok: Callable[[object], bool], what: str) -> Convert:
    def convert(value: object, where: str) -> object:
        if not ok(value):
            raise _Invalid(where, f"must be {what}, got {_kind(value)} {_describe(value)}")
        return value

    return convert


def _integer(value: object, where: str) -> object:
    if isinstance(value, float) and value.is_integer():
        return int(value)  # JSON has one number type; 3.0 is 3
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(where, f"must be an integer, got {_kind(value)} {_describe(value)}")
    return value


def _number(value: object, where: str) -> object:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Invalid(where, f"must be a number, got {_kind(value)} {_describe(value)}")
    return float(value)


_SCALARS: Final[dict[Any, _Field]] = {
    str: _Field({"type": "string"}, _expect(lambda v: isinstance(v, str), "text")),
    bool: _Field({"type": "boolean"}, _expect(lambda v: isinstance(v, bool), "a boolean")),
    int: _Field({"type": "integer"}, _integer),
    float: _Field({"type": "number"}, _number),
    _NONE_TYPE: _Field({"type": "null"}, _expect(lambda v: v is None, "null")),
    Any: _Field({}, lambda value, where: value),
    object: _Field({}, lambda value, where: value),
}


def _field(annotation: Any, where: str, defs: dict[str, Any]) -> _Field:
    """The schema and the converter for one annotation; ``ConfigError`` if it has no JSON form."""
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _field(get_args(annotation)[0], where, defs)
    if origin is Literal:
        return _literal(get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return _union([_field(arm, where, defs) for arm in get_args(annotation)])
    if origin in (list, set, frozenset) or annotation in (list, set, frozenset):
        (item,) = get_args(annotation) or (Any,)
        return _array(_field(item, f"{where}[]", defs), origin or annotation)
    if origin is tuple or annotation is tuple:
        return _tuple(get_args(annotation), where, defs)
    if origin is dict or annotation is dict or origin is Mapping:
        key, value = get_args(annotation) or (str, Any)
        if key is not str:
            raise ConfigError(f"{where}: a dict's keys must be str for JSON, got {key!r}")
        return _mapping(_field(value, f"{where}{{}}", defs))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum(annotation)
    if typing.is_typeddict(annotation):
        return _typed_dict(annotation, where, defs)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _dataclass(annotation, where, defs)
    pydantic = _pydantic_model(annotation)
    if pydantic is not None:
        return pydantic
    raise ConfigError(
        f"{where}: the annotation {annotation!r} has no JSON form a model could send; use str, "
        "int, float, bool, Literal, an Enum, list, dict, tuple, a TypedDict, a dataclass or a "
        "pydantic model"
    )


def _literal(values: tuple[Any, ...]) -> _Field:
    schema: dict[str, Any] = {"enum": list(values)}
    kinds = {type(value) for value in values}
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if len(kinds) == 1 and next(iter(kinds)) in names:
        schema["type"] = names[next(iter(kinds))]

    def convert(value: object, where: str) -> object:
        for allowed in values:
            if value == allowed and type(value) is type(allowed):
                return allowed
        raise _Invalid(where, f"must be one of {_describe(list(values))}, got {_describe(value)}")

    return _Field(schema, convert)


def _enum(kind: type[enum.Enum]) -> _Field:
    members = list(kind)
    field = _literal(tuple(member.value for member in members))

    def convert(value: object, where: str) -> object:
        return kind(field.convert(value, where))

    return _Field(field.schema, convert)


def _union(arms: list[_Field]) -> _Field:
    nullable = [arm for arm in arms if arm.schema == {"type": "null"}]
    others = [arm for arm in arms if arm not in nullable]
    schema = {"anyOf": [arm.schema for arm in others + nullable]}

    def convert(value: object, where: str) -> object:
        failures: list[_Invalid] = []
        for arm in arms:
            try:
                return arm.convert(value, where)
            except _Invalid as invalid:
                if value is None or arm not in nullable:  # "must be null" says nothing here
                    failures.append(invalid)
        if len(failures) == 1:
            raise failures[0]  # one arm it could be: its own reason, at its own path
        raise _Invalid(where, " or ".join(dict.fromkeys(failure.why for failure in failures)))

    return _Field(schema, convert)


def _array(item: _Field, container: Any) -> _Field:
    def convert(value: object, where: str) -> object:
        if not isinstance(value, list | tuple):
            raise _Invalid(where, f"must be an array, got {_kind(value)} {_describe(value)}")
        items = [item.convert(element, f"{where}[{i}]") for i, element in enumerate(value)]
        return container(items) if container in (set, frozenset) else items

    schema: dict[str, Any] = {"type": "array", "items": item.schema}
    if container in (set, frozenset):
        schema["uniqueItems"] = True
    return _Field(schema, convert)


def _tuple(arms: tuple[Any, ...], where: str, defs: dict[str, Any]) -> _Field:
    if not arms or (len(arms) == 2 and arms[1] is Ellipsis):
        item = _field(arms[0] if arms else Any, f"{where}[]", defs)
        array = _array(item, list)

        def convert_any(value: object, path: str) -> object:
            return tuple(array.convert(value, path))  # type: ignore[arg-type]

        return _Field(array.schema, convert_any)
    fields = [_field(arm, f"{where}[{i}]", defs) for i, arm in enumerate(arms)]
    schema = {
        "type": "array",
        "prefixItems": [field.schema for field in fields],
        "minItems": len(fields),
        "maxItems": len(fields),
    }

    def convert(value: object, path: str) -> object:
        if not isinstance(value, list | tuple) or len(value) != len(fields):
            raise _Invalid(path, f"must be an array of {len(fields)} items, got {_describe(value)}")
        return tuple(
            f.convert(v, f"{path}[{i}]") for i, (f, v) in enumerate(zip(fields, value, strict=True))
        )

    return _Field(schema, convert)


def _mapping(value_field: _Field) -> _Field:
    def convert(value: object, where: str) -> object:
        if not isinstance(value, Mapping):
            raise _Invalid(where, f"must be an object, got {_kind(value)} {_describe(value)}")
        return {key: value_field.convert(item, f"{where}.{key}") for key, item in value.items()}

    return _Field({"type": "object", "additionalProperties": value_field.schema}, convert)


def _object(
    properties: dict[str, _Field],
    required: list[str],
    build: Callable[[dict[str, object]], object],
    descriptions: Mapping[str, str] | None = None,
) -> _Field:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            name: {
                **field.schema,
                **(
                    {"description": descriptions[name]}
                    if descriptions and name in descriptions
                    else {}
                ),
            }
            for name, field in properties.items()
        },
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required

    def convert(value: object, where: str) -> object:
        if not isinstance(value, Mapping):
            raise _Invalid(where, f"must be an object, got {_kind(value)} {_describe(value)}")
        return build(_check_object(value, properties, required, where))

    return _Field(schema, convert)


def _check_object(
    value: Mapping[str, object], properties: dict[str, _Field], required: list[str], where: str
) -> dict[str, object]:
    prefix = f"{where}." if where else ""
    for name in value:
        if name not in properties:
            known = ", ".join(properties) or "none"
            raise _Invalid(f"{prefix}{name}", f"is not an argument this takes (it takes {known})")
    for name in required:
        if name not in value:
            raise _Invalid(f"{prefix}{name}", "is required")
    return {name: properties[name].convert(item, f"{prefix}{name}") for name, item in value.items()}


def _hints(owner: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(owner, include_extras=True)
    except Exception as error:
        raise ConfigError(f"{owner!r}: its annotations cannot be resolved ({error})") from error


@functools.cache
def _qualifiers() -> tuple[set[Any], set[Any], set[Any]]:
    """``Required``, ``NotRequired`` and ``ReadOnly`` as ``typing`` and, when installed,
    ``typing_extensions`` spell them."""
    spellings = [typing]
    try:
        import typing_extensions
    except ImportError:  # pragma: no cover - a dependency of anyio and attrs' peers
        pass
    else:
        spellings.append(typing_extensions)
    return tuple(  # type: ignore[return-value]
        {getattr(module, name) for module in spellings if hasattr(module, name)}
        for name in ("Required", "NotRequired", "ReadOnly")
    )


def _key(hint: Any, required: bool) -> tuple[Any, bool]:
    """A TypedDict key's type without its qualifiers, and whether the key is required:
    ``Required[...]``/``NotRequired[...]`` decide, or else what the class says (which
    is wrong in Python 3.11 for a class whose annotations are strings)."""
    must, may, read_only = _qualifiers()
    while (origin := typing.get_origin(hint)) in must | may | read_only:
        if origin in must:
            required = True
        elif origin in may:
            required = False
        hint = typing.get_args(hint)[0]
    return hint, required


def _typed_dict(kind: Any, where: str, defs: dict[str, Any]) -> _Field:
    keys = {name: _key(hint, name in kind.__required_keys__) for name, hint in _hints(kind).items()}
    properties = {name: _field(hint, f"{where}.{name}", defs) for name, (hint, _) in keys.items()}
    required = [name for name, (_, needed) in keys.items() if needed]
    return _object(properties, required, dict)


def _dataclass(kind: type, where: str, defs: dict[str, Any]) -> _Field:
    hints = _hints(kind)
    fields = [field for field in dataclasses.fields(kind) if field.init]
    properties = {f.name: _field(hints.get(f.name, Any), f"{where}.{f.name}", defs) for f in fields}
    required = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    return _object(properties, required, lambda values: kind(**values))


def _pydantic_model(annotation: Any) -> _Field | None:
    try:
        import pydantic
    except ImportError:
        return None
    if not (isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)):
        return None
    schema = annotation.model_json_schema()

    def convert(value: object, where: str) -> object:
        try:
            return annotation.model_validate(value)
        except pydantic.ValidationError as error:
            first = error.errors()[0]
            path = ".".join(str(part) for part in first.get("loc", ()))
            raise _Invalid(f"{where}.{path}" if path else where, str(first.get("msg"))) from None

    return _Field(schema, convert)


# -- docstrings ---------------------------------------------------------------------------

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$"
)
_GOOGLE_ARG = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_ARG = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and each parameter's description."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for raw in lines:
        line = raw.strip()
        sphinx = _SPHINX_ARG.match(line)
        if sphinx:
            current, section = sphinx[1], "sphinx"
            params[current] = sphinx[2].strip()
            continue
        header = _SECTION.match(line)
        if header:
            section, current = header[1], None
            continue
        if section is None:
            if line.startswith(":"):
                section = "sphinx-other"
                continue
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            indent = len(raw) - len(raw.lstrip())
            google = _GOOGLE_ARG.match(line)
            if google and indent <= 4:
                current = google[1].lstrip("*")
                params[current] = google[2].strip()
            elif line and current is not None:
                params[current] = f"{params[current]} {line}".strip()
        elif section == "sphinx" and line and not line.startswith(":") and current is not None:
            params[current] = f"{params[current]} {line}".strip()
        elif line.startswith(":"):
            current = None
    description = "\n".join(summary).strip()
    return re.sub(r"\n{3,}", "\n\n", description), params


# -- the tool -------------------------------------------------------------------------------


def _json_default(value: object) -> tuple[bool, object]:
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False, None
    return True, value


def from_function(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_ms: int | None = None,
    idempotent: bool | None = None,
    destructive: bool | None = None,
) -> ToolDefinition:
    """A ``ToolDefinition`` for ``fn`` (see the module docstring)."""
    if not callable(fn):
        raise ConfigError(f"from_function: {fn!r} is not a function", key="fn", value=fn)
    tool_name = name or getattr(fn, "__name__", None)
    if not isinstance(tool_name, str) or not tool_name or tool_name == "<lambda>":
        raise ConfigError(f"from_function: give {fn!r} a name=", key="name", value=tool_name)
    owner = f"tool {tool_name!r}"
    summary, described = parse_docstring(inspect.getdoc(fn))
    signature = inspect.signature(fn)
    hints = _hints(fn)
    properties: dict[str, _Field] = {}
    required: list[str] = []
    defaults: dict[str, object] = {}
    call_parameter: str | None = None
    open_ended = False
    defs: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        where = f"{owner}: parameter {parameter.name!r}"
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.VAR_POSITIONAL):
            raise ConfigError(
                f"{where} cannot be given by name; a model sends named arguments only "
                "(make it a normal or keyword-only parameter)",
                key=parameter.name,
            )
        annotation = hints.get(parameter.name, Any)
        if annotation is ToolCall:
            call_parameter = parameter.name
            continue
        if parameter.kind is parameter.VAR_KEYWORD:
            open_ended = True
            continue
        properties[parameter.name] = _field(annotation, where, defs)
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        else:
            ok, default = _json_default(parameter.default)
            if ok:
                defaults[parameter.name] = default
    parameters = _object(properties, required, dict, described).schema
    for key, default in defaults.items():
        parameters["properties"][key]["default"] = default
    if open_ended:
        parameters.pop("additionalProperties")
    is_async = inspect.iscoroutinefunction(fn)
    invoke = _invoker(fn, properties, required, call_parameter, open_ended, is_async)
    return ToolDefinition(
        tool_name,
        invoke,
        summary if description is None else description,
        parameters,
        timeout_ms,
        idempotent,
        destructive=destructive,
    )


def _invoker(
    fn: Callable[..., Any],
    properties: dict[str, _Field],
    required: list[str],
    call_parameter: str | None,
    open_ended: bool,
    is_async: bool,
) -> Callable[..., Any]:
    def arguments_for(arguments: Mapping[str, Any], call: ToolCall) -> dict[str, object]:
        if open_ended:  # the keys it does not declare go to its **kwargs as they are
            named = {key: value for key, value in arguments.items() if key in properties}
            converted = _check_object(named, properties, required, "")
            converted.update((key, value) for key, value in arguments.items() if key not in named)
        else:  # an unknown key is named by the check
            converted = _check_object(arguments, properties, required, "")
        if call_parameter is not None:
            converted[call_parameter] = call
        return converted

    def refused(invalid: _Invalid) -> object:
        return invalid_arguments_result(f"argument {invalid.where!r} {invalid.why}")

    if is_async:

        async def run_async(arguments: Mapping[str, Any], call: ToolCall) -> object:
            try:
                converted = arguments_for(arguments, call)
            except _Invalid as invalid:
                return refused(invalid)
            return await fn(**converted)

        run_async.__name__ = getattr(fn, "__name__", "tool")
        return run_async

    def run(arguments: Mapping[str, Any], call: ToolCall) -> object:
        try:
            converted = arguments_for(arguments, call)
        except _Invalid as invalid:
            return refused(invalid)
        return fn(**converted)

    run.__name__ = getattr(fn, "__name__", "tool")
    return run


@typing.overload
def tool(fn: Callable[..., Any], /) -> ToolDefinition: ...
@typing.overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_ms: int | None = None,
    idempotent: bool | None = None,
    destructive: bool | None = None,
) -> Callable[[Callable[..., Any]], ToolDefinition]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_ms: int | None = None,
    idempotent: bool | None = None,
    destructive: bool | None = None,
) -> ToolDefinition | Callable[[Callable[..., Any]], ToolDefinition]:
    """``@tool`` or ``@tool(timeout_ms=…)``: the function as a ``ToolDefinition``."""
    options = {
        "name": name,
        "description": description,
        "timeout_ms": timeout_ms,
        "idempotent": idempotent,
        "destructive": destructive,
    }
    if fn is not None:
        return from_function(fn, **options)  # type: ignore[arg-type]

    def decorate(function: Callable[..., Any]) -> ToolDefinition:
        return from_function(function, **options)  # type: ignore[arg-type]

    return decorate
