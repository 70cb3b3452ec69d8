"""Plugin configuration is validated and described from one list of fields."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b2bhub.plugin.schema import (
    ConfigError,
    Field,
    openapi_config_schema,
    schema_problem,
    schema_to_json,
    validate_config,
)


def must_be_absolute(value: str) -> str | None:
    return None if value.startswith("/") else "must be an absolute path"


WRITER = [
    Field(
        "base_directory", "path", required=True, help="Folder written to", validate=must_be_absolute
    ),
    Field("filename_pattern", "string", default="{message_id}.dat"),
    Field("overwrite", "boolean", default=False),
    Field("polling_interval", "integer", default=10, min=1, max=3600),
    Field("timeout", "number", default=30.0, min=0.5),
    Field(
        "payload_stage",
        "choice",
        default="unpacked",
        choices=("raw", "unpacked", "sent", "receipt"),
    ),
    Field("headers", "json", default={}),
    Field("password", "secret", default="changeme"),
]


def test_defaults_are_filled_in():
    assert validate_config(WRITER, {"base_directory": "/out"}) == {
        "base_directory": "/out",
        "filename_pattern": "{message_id}.dat",
        "overwrite": False,
        "polling_interval": 10,
        "timeout": 30.0,
        "payload_stage": "unpacked",
        "headers": {},
        "password": "changeme",
    }


def test_form_strings_are_coerced():
    form = {
        "base_directory": "/out",
        "overwrite": "on",
        "polling_interval": " 60 ",
        "timeout": "2.5",
        "payload_stage": "raw",
        "headers": '{"X-Env": "prod"}',
        "filename_pattern": "",
    }
    config = validate_config(WRITER, form)
    assert config["overwrite"] is True
    assert config["polling_interval"] == 60
    assert config["timeout"] == 2.5
    assert config["payload_stage"] == "raw"
    assert config["headers"] == {"X-Env": "prod"}
    assert config["filename_pattern"] == "{message_id}.dat"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("true", True),
        ("on", True),
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("false", False),
        ("off", False),
        ("0", False),
        (True, True),
        (False, False),
        (0, False),
    ],
)
def test_boolean_words(text, expected):
    config = validate_config(WRITER, {"base_directory": "/out", "overwrite": text})
    assert config["overwrite"] is expected


def test_every_bad_field_is_reported_at_once():
    config = {
        "polling_interval": "often",
        "timeout": 0.1,
        "payload_stage": "zipped",
        "headers": "{not json",
        "overwrite": "maybe",
        "colour": "blue",
    }
    with pytest.raises(ConfigError) as info:
        validate_config(WRITER, config)
    errors = info.value.errors
    assert errors == {
        "colour": "unknown field",
        "base_directory": "required",
        "overwrite": "must be true or false",
        "polling_interval": "must be an integer",
        "timeout": "must be at least 0.5",
        "payload_stage": "must be one of: raw, unpacked, sent, receipt",
        "headers": errors["headers"],
    }
    assert errors["headers"].startswith("invalid JSON")
    for name in errors:
        assert name in str(info.value)


def test_bounds_and_custom_validation():
    with pytest.raises(ConfigError) as info:
        validate_config(WRITER, {"base_directory": "out", "polling_interval": 7200})
    assert info.value.errors == {
        "base_directory": "must be an absolute path",
        "polling_interval": "must be at most 3600",
    }


@pytest.mark.parametrize(
    "field, value",
    [
        (Field("n", "integer"), True),
        (Field("n", "integer"), 1.5),
        (Field("n", "number"), "nan"),
        (Field("n", "number"), [1]),
        (Field("s", "string"), 5),
        (Field("p", "path"), "/a\0b"),
        (Field("j", "json"), {1, 2}),
        (Field("n", "number"), 10**400),
    ],
)
def test_wrong_types_are_refused(field, value):
    with pytest.raises(ConfigError):
        validate_config([field], {field.name: value})
    with pytest.raises(ConfigError):
        validate_config([field], {field.name: value}, strict=True)


@pytest.mark.parametrize(
    "field, value, message",
    [
        (Field("i", "integer"), "10", "must be an integer"),
        (Field("i", "integer"), 10.0, "must be an integer"),
        (Field("i", "integer"), True, "must be an integer"),
        (Field("i", "integer"), "", "must be an integer"),
        (Field("n", "number"), "2.5", "must be a number"),
        (Field("n", "number"), False, "must be a number"),
        (Field("b", "boolean"), "on", "must be true or false"),
        (Field("b", "boolean"), 1, "must be true or false"),
        (Field("c", "choice", choices=(1, 2)), "2", "must be one of: 1, 2"),
        (Field("c", "choice", choices=(1, 2)), True, "must be one of: 1, 2"),
        (Field("c", "choice", choices=("a", "b")), "", "must be one of: a, b"),
        (Field("s", "string"), 5, "must be a string"),
    ],
)
def test_a_strict_json_body_is_not_coerced(field, value, message):
    """What a form's text may say, a JSON body must say with the JSON type itself."""
    with pytest.raises(ConfigError) as refused:
        validate_config([field], {field.name: value}, strict=True)
    assert refused.value.errors == {field.name: message}


def test_a_strict_json_body_takes_json_values_as_they_are():
    config = validate_config(WRITER, {
        "base_directory": "/out", "overwrite": True, "polling_interval": 60, "timeout": 2,
        "payload_stage": "raw", "headers": '{"X-Env": "prod"}', "filename_pattern": "",
        "password": None}, strict=True)
    assert config["headers"] == '{"X-Env": "prod"}'  # a string, not JSON text to parse
    assert config["timeout"] == 2.0 and isinstance(config["timeout"], float)
    assert (config["overwrite"], config["polling_interval"]) == (True, 60)
    # null, and an empty text, leave a field at its default
    assert (config["filename_pattern"], config["password"]) == ("{message_id}.dat",
                                                                "changeme")
    with pytest.raises(ConfigError) as refused:
        validate_config(WRITER, {"base_directory": ""}, strict=True)
    assert refused.value.errors == {"base_directory": "required"}


def test_the_openapi_schema_says_the_strict_rules():
    body = openapi_config_schema(WRITER)
    assert body["required"] == ["base_directory"] and body["additionalProperties"] is False
    props = body["properties"]
    assert props["polling_interval"] == {
        "x-field-type": "integer", "description": "Polling interval", "type": "integer",
        "default": 10, "minimum": 1, "maximum": 3600, "nullable": True}
    assert props["base_directory"]["minLength"] == 1
    assert props["base_directory"]["pattern"] == "^[^\\x00]*$"
    assert "nullable" not in props["base_directory"]
    assert props["payload_stage"]["enum"] == ["raw", "unpacked", "sent", "receipt", None]
    assert props["payload_stage"]["type"] == "string"
    assert "type" not in props["headers"] and "nullable" not in props["headers"]
    assert "default" not in props["password"] and props["password"]["format"] == "password"
    shown = openapi_config_schema(WRITER, answer=True, mask="***")
    assert "required" not in shown and "additionalProperties" not in shown
    # stored, a field with a default is never null
    assert "nullable" not in shown["properties"]["polling_interval"]
    assert "(shown as *** when set)" in shown["properties"]["password"]["description"]


def test_choice_given_as_text_selects_the_value():
    field = Field("level", "choice", choices=(1, 2, 3))
    assert validate_config([field], {"level": "2"}) == {"level": 2}


def test_mutable_defaults_are_not_shared():
    first = validate_config(WRITER, {"base_directory": "/out"})
    first["headers"]["X-Changed"] = "yes"
    assert validate_config(WRITER, {"base_directory": "/out"})["headers"] == {}


@given(st.integers(min_value=1, max_value=3600))
def test_integers_round_trip_through_form_text(number):
    config = validate_config(WRITER, {"base_directory": "/o", "polling_interval": str(number)})
    assert config["polling_interval"] == number


def test_field_declaration_is_checked():
    with pytest.raises(ValueError):
        Field("x", "colour")
    with pytest.raises(ValueError):
        Field("x", "choice")


def test_schema_to_json_describes_the_fields():
    schema = schema_to_json(WRITER)
    json.dumps(schema)
    assert schema["type"] == "object"
    assert schema["required"] == ["base_directory"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert list(props) == [field.name for field in WRITER]
    assert props["base_directory"] == {
        "x-field-type": "path",
        "type": "string",
        "title": "Base directory",
        "description": "Folder written to",
    }
    assert props["polling_interval"] == {
        "x-field-type": "integer",
        "type": "integer",
        "title": "Polling interval",
        "description": "",
        "default": 10,
        "minimum": 1,
        "maximum": 3600,
    }
    assert props["payload_stage"]["enum"] == ["raw", "unpacked", "sent", "receipt"]
    assert "type" not in props["headers"]
    assert props["password"]["writeOnly"] is True
    assert "default" not in props["password"]


def test_a_field_is_called_by_its_label_else_by_its_name_made_readable():
    assert Field("take_by_link", "boolean", label="Take files by hard link").title == \
        "Take files by hard link"
    assert Field("take_by_link", "boolean").title == "Take by link"
    assert schema_to_json([Field("url", "string", label="URL")])["properties"]["url"][
        "title"] == "URL"


def test_every_built_in_plugin_field_has_a_label():
    from plugins.as2.plugin import As2Receiver, As2Sender
    from plugins.file_poller import FilePoller
    from plugins.file_writer import FileWriter
    from plugins.http_collector import HttpCollector
    from plugins.http_poster import HttpPoster
    from plugins.http_receiver import HttpReceiver
    for cls in (As2Receiver, As2Sender, FilePoller, FileWriter, HttpCollector, HttpPoster,
                HttpReceiver):
        for field in cls.config_schema:
            assert field.label and field.label[0].isupper(), (cls.type_name, field.name)
            assert "_" not in field.label, (cls.type_name, field.name)


def test_schema_problem():
    assert schema_problem(WRITER) is None
    assert schema_problem([]) is None
    assert "list" in schema_problem(None)
    assert "not a Field" in schema_problem(["url"])
    assert "twice" in schema_problem([Field("a", "string"), Field("a", "integer")])
