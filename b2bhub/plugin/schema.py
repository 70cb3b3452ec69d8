"""A small declarative configuration schema for plugin types (SPEC 3).

A plugin type lists its :class:`Field` s; from that one list the core validates an
instance's configuration, the web form is drawn and the API describes the type
(:func:`schema_to_json`, and :func:`openapi_config_schema` for the OpenAPI document).
Values coming from an HTML form are strings, so validation coerces them ('10' -> 10,
'on' -> True, JSON text -> a value); a JSON body of the API is validated ``strict``ly
instead: each value must already be of its field's JSON type, as the OpenAPI document
says. Plain Python: no Flask, no Celery, no SQLAlchemy.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from b2bhub.domain.i18n import N_, joined

__all__ = [
    "FIELD_TYPES",
    "ConfigError",
    "Field",
    "openapi_config_schema",
    "schema_problem",
    "schema_to_json",
    "validate_config",
]

FIELD_TYPES = frozenset(
    {"string", "integer", "number", "boolean", "choice", "json", "path", "secret"}
)
TRUE_WORDS = frozenset({"true", "on", "1", "yes"})
FALSE_WORDS = frozenset({"false", "off", "0", "no"})
JSON_TYPES = {
    "string": "string",
    "path": "string",
    "secret": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
}


@dataclass(frozen=True)
class Field:
    """One configuration field of a plugin type.

    ``type`` is one of :data:`FIELD_TYPES`; ``min``/``max`` bound integer and number
    fields; ``validate`` gets the coerced value and returns an error message or None.
    ``label`` is what a form calls it ("Base directory"); without one the form shows
    the name with its underscores as spaces (:attr:`title`).
    """

    name: str
    type: str
    default: Any = None
    required: bool = False
    help: str = ""
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    validate: Callable[[Any], str | None] | None = None
    label: str = ""

    @property
    def title(self) -> str:
        """The field's name for people: its label, else its name made readable."""
        return self.label or self.name.replace("_", " ").capitalize()

    def __post_init__(self) -> None:
        if self.type not in FIELD_TYPES:
            raise ValueError(f"field {self.name!r}: unknown type {self.type!r}")
        if self.type == "choice" and not self.choices:
            raise ValueError(f"field {self.name!r}: a choice field needs choices")


class ConfigError(ValueError):
    """A configuration was refused; ``errors`` maps each bad field to what is wrong."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        #: the same, each field's text (a :class:`~b2bhub.domain.i18n.Text` when ours)
        #: kept, so a page can show it in the reader's language
        self.text = joined(N_("%(name)s: %(problem)s", name=name, problem=text)
                           for name, text in self.errors.items())
        super().__init__(str(self.text))


def validate_config(fields: Sequence[Field], config: dict[str, Any], *,
                    strict: bool = False) -> dict[str, Any]:
    """Return ``config`` normalised: every field present, defaults filled in, values
    coerced to their type. Raise :class:`ConfigError` naming every bad field at once,
    so a form can show all its errors together. Unknown keys are refused.

    A missing key, None or an empty string count as not given. An HTML form must
    therefore send an explicit false for an unchecked box whose default is true.

    ``strict`` (a JSON body of the API): no coercion. A value must be of its field's
    JSON type (an integer field takes a JSON integer, not "10" nor 10.0; a boolean
    field true or false; a choice exactly one of the choices; a json field any value,
    as it is); only a missing key or null count as not given, and an empty string
    only for the text fields (string, path, secret) and json ones.
    """
    known = {field.name for field in fields}
    errors = {key: N_("unknown field") for key in config if key not in known}
    result: dict[str, Any] = {}
    for field in fields:
        try:
            result[field.name] = _field_value(field, config.get(field.name), strict)
        except ValueError as exc:
            errors[field.name] = exc.args[0] if exc.args else str(exc)
    if errors:
        raise ConfigError(errors)
    return result


def _field_value(field: Field, raw: Any, strict: bool = False) -> Any:
    """The normalised value of one field; ValueError carries the message for the user."""
    if raw is None or (raw == "" and (not strict or field.type in EMPTY_IS_NOT_GIVEN)):
        if field.required:
            raise ValueError(N_("required"))
        return copy.deepcopy(field.default)
    value = (STRICT if strict else COERCE)[field.type](field, raw)
    _check_bounds(field, value)
    if field.validate is not None:
        message = field.validate(value)
        if message:
            raise ValueError(message)
    return value


def _as_string(field: Field, raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError(N_("must be a string"))
    if field.type == "path" and "\0" in raw:
        raise ValueError(N_("must not contain a NUL character"))
    return raw


def _as_integer(field: Field, raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError(N_("must be an integer"))
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            pass
    raise ValueError(N_("must be an integer"))


def _as_number(field: Field, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(N_("must be a number"))
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except ValueError:
        raise ValueError(N_("must be a number")) from None
    except OverflowError:  # an integer of hundreds of digits
        raise ValueError(N_("must be a finite number")) from None
    if not math.isfinite(value):
        raise ValueError(N_("must be a finite number"))
    return value


def _as_boolean(field: Field, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    word = str(raw).strip().lower() if isinstance(raw, str | int) else None
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(N_("must be true or false"))


def _as_choice(field: Field, raw: Any) -> Any:
    for choice in field.choices:
        # A form sends every choice as text, so '2' selects the choice 2.
        if raw == choice or (isinstance(raw, str) and raw == str(choice)):
            return choice
    raise ValueError(N_("must be one of: %(choices)s",
                        choices=", ".join(str(choice) for choice in field.choices)))


def _as_json(field: Field, raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(N_("invalid JSON: %(why)s at line %(line)s column %(column)s",
                                why=exc.msg, line=exc.lineno, column=exc.colno)) from None
    try:
        json.dumps(raw)
    except (TypeError, ValueError):
        raise ValueError(N_("must be a JSON value")) from None
    return raw


COERCE: dict[str, Callable[[Field, Any], Any]] = {
    "string": _as_string,
    "path": _as_string,
    "secret": _as_string,
    "integer": _as_integer,
    "number": _as_number,
    "boolean": _as_boolean,
    "choice": _as_choice,
    "json": _as_json,
}


def _strict_integer(field: Field, raw: Any) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    raise ValueError(N_("must be an integer"))


def _strict_number(field: Field, raw: Any) -> float:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return _as_number(field, raw)
    raise ValueError(N_("must be a number"))


def _strict_boolean(field: Field, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    raise ValueError(N_("must be true or false"))


def _strict_choice(field: Field, raw: Any) -> Any:
    for choice in field.choices:
        if raw == choice and type(raw) is type(choice):  # 1 is not True, "2" not 2
            return choice
    raise ValueError(N_("must be one of: %(choices)s",
                        choices=", ".join(str(choice) for choice in field.choices)))


def _strict_json(field: Field, raw: Any) -> Any:
    if isinstance(raw, str):
        return raw  # a JSON string is a value of its own, not JSON text to parse
    return _as_json(field, raw)


#: the fields whose empty string counts as not given in a strict (JSON) body too
EMPTY_IS_NOT_GIVEN = frozenset({"string", "path", "secret", "json"})
STRICT: dict[str, Callable[[Field, Any], Any]] = {
    **COERCE,
    "integer": _strict_integer,
    "number": _strict_number,
    "boolean": _strict_boolean,
    "choice": _strict_choice,
    "json": _strict_json,
}


def _check_bounds(field: Field, value: Any) -> None:
    if field.type not in ("integer", "number"):
        return
    if field.min is not None and value < field.min:
        raise ValueError(N_("must be at least %(least)s", least=_plain(field.min)))
    if field.max is not None and value > field.max:
        raise ValueError(N_("must be at most %(most)s", most=_plain(field.max)))


def _plain(bound: float) -> str:
    """Show 1.0 as 1 in messages: bounds are usually whole numbers."""
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def schema_to_json(fields: Sequence[Field]) -> dict[str, Any]:
    """Describe ``fields`` as JSON Schema for the API and the form.

    ``x-field-type`` keeps the exact field type (path, secret, json...) that JSON Schema
    has no word for; a secret's default is never shown.
    """
    return {
        "type": "object",
        "properties": {field.name: _property(field) for field in fields},
        "required": [field.name for field in fields if field.required],
        "additionalProperties": False,
    }


def _property(field: Field) -> dict[str, Any]:
    prop: dict[str, Any] = {"x-field-type": field.type, "title": field.title,
                            "description": field.help}
    if field.type in JSON_TYPES:
        prop["type"] = JSON_TYPES[field.type]
    if field.type == "choice":
        prop["enum"] = list(field.choices)
    if field.type == "secret":
        prop["format"] = "password"
        prop["writeOnly"] = True
    elif field.default is not None:
        prop["default"] = field.default
    if field.min is not None:
        prop["minimum"] = field.min
    if field.max is not None:
        prop["maximum"] = field.max
    return prop


#: what a path field takes: any text without a NUL character
NO_NUL = "^[^\\x00]*$"


def openapi_config_schema(fields: Sequence[Field], *, answer: bool = False,
                          mask: str = "") -> dict[str, Any]:
    """The OpenAPI 3.0 schema of a configuration of ``fields``: in a JSON body of the
    API, with :func:`validate_config`'s ``strict`` rules as its constraints (each
    field's JSON type and bounds; the required fields present, not null and, if text,
    not empty; no other key; null leaves an optional field at its default); or, with
    ``answer``, as an answer shows a stored one, a secret that is set as ``mask``.

    A field's own ``validate`` and the type's checks across fields are the hub's to
    judge; they are not in the schema.
    """
    schema: dict[str, Any] = {"type": "object", "properties": {
        field.name: _openapi_property(field, answer, mask) for field in fields}}
    if not answer:
        required = [field.name for field in fields if field.required]
        schema.update({"additionalProperties": False, **({"required": required}
                                                          if required else {})})
    return schema


def _openapi_property(field: Field, answer: bool, mask: str) -> dict[str, Any]:
    # a stored optional field is null only when its default is; a body's may be null
    nullable = not field.required and (field.default is None or not answer)
    words = f"{field.title}: {field.help}" if field.help else field.title
    prop: dict[str, Any] = {"x-field-type": field.type, "description": words}
    if field.type in JSON_TYPES:
        prop["type"] = JSON_TYPES[field.type]
    if field.type == "choice":
        kinds = {type(choice) for choice in field.choices}
        if kinds in ({str}, {int}):
            prop["type"] = "string" if kinds == {str} else "integer"
        prop["enum"] = list(field.choices) + ([None] if nullable else [])
    if field.type == "path":
        prop["pattern"] = NO_NUL
    if field.type == "secret":
        prop["format"] = "password"
        if answer:
            prop["description"] += f" (shown as {mask} when set)"
    elif field.default is not None:
        prop["default"] = copy.deepcopy(field.default)
    if field.required and not answer and field.type in ("string", "path", "secret"):
        prop["minLength"] = 1  # an empty text is not given
    if field.min is not None:
        prop["minimum"] = field.min
    if field.max is not None:
        prop["maximum"] = field.max
    if nullable and field.type != "json":  # a json field takes any value, null too
        prop["nullable"] = True
    return prop


def schema_problem(fields: Any) -> str | None:
    """What is wrong with a plugin's ``config_schema``, or None: it must be a list of
    :class:`Field` with distinct names. The registry refuses a plugin that fails this."""
    if not isinstance(fields, list | tuple):
        return "config_schema must be a list of Field"
    names: set[str] = set()
    for field in fields:
        if not isinstance(field, Field):
            return f"config_schema holds {field!r}, not a Field"
        if field.name in names:
            return f"config_schema names the field {field.name!r} twice"
        names.add(field.name)
    return None
