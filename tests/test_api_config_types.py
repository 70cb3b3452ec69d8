"""An instance's ``config`` in the OpenAPI document is typed by its plugin type, a
built-in's or a third party's, from the app's registry: ``{Type}Config`` for a body,
``{Type}ConfigShown`` for an answer. The API holds a JSON body to that schema: for every
configuration tried, the document's verdict is the API's (a wrongly typed value, form
text such as "10" included, is a 400 naming the field and the type it must have). An
HTML form and a fixtures file still take form text."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_schema_validator import OAS30Validator
from sqlalchemy import select

from b2bhub.models import PluginInstance
from b2bhub.plugin.schema import Field
from b2bhub.services.config import MAX_CONCURRENT_DELIVERIES, MAX_PROBE_INTERVAL, MAX_RETENTION_DAYS
from b2bhub.services.fixtures import load_fixtures
from plugins.file_poller import FilePoller
from tests.test_api import error_of


class Gadget:
    """A third party's target, with the field types the built-ins above do not show."""

    type_name = "gadget"
    roles = frozenset({"target"})
    config_schema = [Field("level", "choice", choices=(1, 2, 3), default=1),
                     Field("options", "json", default={}),
                     Field("ratio", "number", min=0, max=1, default=0.5),
                     Field("token", "secret", required=True)]

    def __init__(self, instance_name: str, config: dict[str, Any]):
        self.config = config


@pytest.fixture
def doc(api, registry):
    registry.register(FilePoller)
    registry.register(Gadget)
    return api.get("/api/v1/openapi.json").get_json()


def schema_says(doc: dict, name: str, value: Any) -> bool:
    """Whether the document's schema ``name`` calls ``value`` valid (OpenAPI 3.0)."""
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return OAS30Validator(root).is_valid(value)


def test_the_document_types_a_built_in_types_config(doc):
    schemas = doc["components"]["schemas"]
    config = schemas["FilePollerConfig"]
    assert config["additionalProperties"] is False
    assert config["required"] == ["base_directory"]
    assert set(config["properties"]) == {field.name for field in FilePoller.config_schema}
    interval = config["properties"]["polling_interval"]
    assert (interval["type"], interval["minimum"], interval["maximum"]) == ("integer", 1, 86400)
    field = next(f for f in FilePoller.config_schema if f.name == "polling_interval")
    assert (interval["minimum"], interval["maximum"], interval["default"]) == (
        field.min, field.max, field.default)
    assert interval["nullable"] is True  # null: the default
    assert config["properties"]["take_by_link"]["type"] == "boolean"
    base = config["properties"]["base_directory"]
    assert (base["type"], base["minLength"]) == ("string", 1) and "nullable" not in base

    # the body to create is one per type, told apart by "type"
    create = schemas["InstanceCreate"]
    assert create["discriminator"]["mapping"]["file_poller"] == \
        "#/components/schemas/FilePollerInstanceCreate"
    variant = schemas["FilePollerInstanceCreate"]
    assert variant["properties"]["type"]["enum"] == ["file_poller"]
    assert variant["properties"]["config"] == {"$ref": "#/components/schemas/FilePollerConfig"}
    assert "config" in variant["required"]  # base_directory has no default
    assert {"$ref": "#/components/schemas/FilePollerInstanceChange"} in \
        schemas["InstanceFields"]["anyOf"]
    shown = schemas["FilePollerInstance"]["properties"]["config"]
    assert shown == {"$ref": "#/components/schemas/FilePollerConfigShown"}
    assert schemas["FilePollerConfigShown"]["properties"]["polling_interval"]["type"] == \
        "integer"


def test_a_third_party_type_is_typed_too(doc):
    schemas = doc["components"]["schemas"]
    config = schemas["GadgetConfig"]["properties"]
    assert config["level"]["type"] == "integer"
    assert config["level"]["enum"] == [1, 2, 3, None]
    assert (config["ratio"]["type"], config["ratio"]["minimum"], config["ratio"]["maximum"]) \
        == ("number", 0, 1)
    assert "type" not in config["options"]  # any JSON value
    assert config["token"]["format"] == "password" and "default" not in config["token"]
    assert schemas["GadgetConfig"]["required"] == ["token"]
    assert "********" in schemas["GadgetConfigShown"]["properties"]["token"]["description"]
    assert schemas["InstanceCreate"]["discriminator"]["mapping"]["gadget"] == \
        "#/components/schemas/GadgetInstanceCreate"


MISSING = object()  # the key left out
FILE_POLLER_CONFIGS = [
    {}, {"polling_interval": 60}, {"polling_interval": "60"}, {"polling_interval": 60.0},
    {"polling_interval": True}, {"polling_interval": 0}, {"polling_interval": 86400},
    {"polling_interval": 86401}, {"polling_interval": None}, {"polling_interval": ""},
    {"take_by_link": True}, {"take_by_link": "true"}, {"take_by_link": 1},
    {"take_by_link": None}, {"from": "acme"}, {"from": 5}, {"from": None}, {"from": ""},
    {"archive_directory": None}, {"archive_directory": "a\x00b"}, {"archive_directory": 7},
    {"nonsense": 1}, {"base_directory": ""}, {"base_directory": None},
    {"base_directory": MISSING},
    {"base_directory": 5}, {"base_directory": "/x\x00"},
]
GADGET_CONFIGS = [
    {}, {"level": 2}, {"level": "2"}, {"level": True}, {"level": 4}, {"level": None},
    {"level": ""}, {"ratio": 1}, {"ratio": 0.25}, {"ratio": "0.25"}, {"ratio": 1.5},
    {"ratio": False}, {"options": {"a": [1]}}, {"options": "not JSON text, a string"},
    {"options": None}, {"options": 3}, {"token": ""}, {"token": None}, {"token": 5},
    {"token": MISSING},
]


def test_the_documents_verdict_on_a_config_is_the_apis(api, doc, tmp_path):
    tried = []
    for type_name, base, configs in (
            ("file_poller", {"base_directory": str(tmp_path / "in"), "to": "acme"},
             FILE_POLLER_CONFIGS),
            ("gadget", {"token": "s3cret"}, GADGET_CONFIGS)):
        for n, change in enumerate(configs):
            config = {key: value for key, value in {**base, **change}.items()
                      if value is not MISSING}
            body = {"name": f"{type_name}-{n}", "type": type_name, "config": config}
            valid = schema_says(doc, "InstanceCreate", body)
            answer = api.post("/api/v1/plugins/configs", json=body)
            tried.append((config, valid))
            if valid:
                assert answer.status_code == 201, (body, answer.get_json())
                assert schema_says(doc, "Instance", answer.get_json())
                assert schema_says(doc, f"{type_name.title().replace('_', '')}Instance",
                                   answer.get_json()), answer.get_json()
            else:
                error = error_of(answer, 400, "invalid")
                assert set(error["details"]) == {"config"}, (body, error)
                assert set(error["details"]["config"]) <= set(change) | set(base), error
    # both verdicts came up, for both types
    assert {valid for _config, valid in tried} == {True, False}
    assert sum(not valid for _config, valid in tried) >= 20


def test_a_wrong_json_type_is_refused_naming_the_field_and_its_type(api, doc, tmp_path,
                                                                     session):
    base = str(tmp_path / "in")
    error = error_of(api.post("/api/v1/plugins/configs", json={
        "name": "poller", "type": "file_poller",
        "config": {"base_directory": base, "to": "acme", "polling_interval": "10",
                   "take_by_link": "yes"}}),
        400, "invalid")
    assert error["details"] == {"config": {"polling_interval": "must be an integer",
                                           "take_by_link": "must be true or false"}}
    assert "polling_interval: must be an integer" in error["message"]
    assert api.get("/api/v1/plugins/configs/poller").status_code == 404

    created = api.post("/api/v1/plugins/configs", json={
        "name": "poller", "type": "file_poller",
        "config": {"base_directory": base, "to": "acme", "polling_interval": 10}})
    assert created.status_code == 201, created.get_json()
    error = error_of(api.put("/api/v1/plugins/configs/poller", json={
        "config": {"base_directory": base, "to": "acme", "polling_interval": 10.5}}),
        400, "invalid")
    assert error["details"] == {"config": {"polling_interval": "must be an integer"}}
    assert api.get("/api/v1/plugins/configs/poller").get_json() == created.get_json()


@pytest.mark.parametrize("field, largest", [
    ("max_concurrent_deliveries", MAX_CONCURRENT_DELIVERIES),
    ("probe_interval", MAX_PROBE_INTERVAL),
    ("retention_days", MAX_RETENTION_DAYS)])
def test_an_instances_whole_numbers_have_a_largest_value_the_document_gives(
        api, doc, tmp_path, field, largest):
    """Beyond a 32-bit column's range PostgreSQL refused the row, and the caller saw a
    500 (found by the fuzz); the rule is a clear 400 now, the same on both backends, and
    its bound is in the document."""
    schemas = doc["components"]["schemas"]
    for variant in ("FilePollerInstanceCreate", "FilePollerInstanceChange", "GadgetInstanceChange"):
        assert schemas[variant]["properties"][field]["maximum"] == largest
    body = {"name": "poller", "type": "file_poller",
            "config": {"base_directory": str(tmp_path / "in"), "to": "acme"}}
    error = error_of(api.post("/api/v1/plugins/configs",
                              json={**body, field: 2_042_357_358_395_437}), 400)
    assert set(error["details"]) == {field}
    assert api.get("/api/v1/plugins/configs/poller").status_code == 404
    created = api.post("/api/v1/plugins/configs", json={**body, field: largest})
    assert created.status_code == 201, created.get_json()
    assert api.get("/api/v1/plugins/configs/poller").get_json()[field] == largest
    error_of(api.put("/api/v1/plugins/configs/poller", json={field: largest + 1}), 400)
    assert api.get("/api/v1/plugins/configs/poller").get_json()[field] == largest


def test_a_change_without_config_keeps_it(api, doc, tmp_path):
    body = {"name": "poller", "type": "file_poller",
            "config": {"base_directory": str(tmp_path / "in"), "to": "acme",
                       "polling_interval": 30, "take_by_link": True}}
    created = api.post("/api/v1/plugins/configs", json=body).get_json()
    changed = api.put("/api/v1/plugins/configs/poller", json={"enabled": False})
    assert changed.status_code == 200, changed.get_json()
    assert changed.get_json()["enabled"] is False
    assert changed.get_json()["config"] == created["config"]
    assert created["config"]["polling_interval"] == 30


def test_a_secret_stays_masked_and_kept_in_a_typed_body(api, doc, session):
    created = api.post("/api/v1/plugins/configs", json={
        "name": "gadget", "type": "gadget", "config": {"token": "s3cret", "level": 2}})
    assert created.status_code == 201, created.get_json()
    shown = created.get_json()
    assert shown["config"]["token"] == "********"
    assert schema_says(doc, "GadgetInstance", shown)
    config = {**shown["config"], "level": 3}
    assert schema_says(doc, "InstanceFields", {"config": config})
    changed = api.put("/api/v1/plugins/configs/gadget", json={"config": config})
    assert changed.status_code == 200, changed.get_json()
    assert changed.get_json()["config"]["token"] == "********"
    session.expire_all()
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "gadget"))
    assert (row.config["token"], row.config["level"]) == ("s3cret", 3)


def test_a_fixtures_file_still_takes_form_text(session, registry, tmp_path):
    """Files written for earlier versions load as they did (an HTML form's text is
    coerced as before too: tests/test_ui.py)."""
    registry.register(FilePoller)
    load_fixtures(session, {"plugins": [{
        "name": "poller", "type": "file_poller", "config": {
            "base_directory": str(tmp_path / "in"), "to": "acme", "polling_interval": "15",
            "take_by_link": "true"}}]}, registry=registry)
    session.commit()
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == "poller"))
    assert (row.config["polling_interval"], row.config["take_by_link"]) == (15, True)
