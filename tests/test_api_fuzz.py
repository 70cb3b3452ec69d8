"""schemathesis against /api/v1/openapi.json, through its own engine and with every one
of its checks: the coverage, fuzzing and stateful phases (and examples, where the
document has any), positive and negative data, against the app served on loopback, for
every documented operation of a hub with a little data (AS2 profiles included; plugin
instances typed by one plugin type of each shape, :func:`registry`). No
answer is a 5xx; every status code, content type, header and body is the document's;
data the document calls valid is accepted and data it calls invalid is refused; a method
the document does not list answers 405 with ``Allow``. Checks of our own: a 204 has no
content type; every 4xx is one the operation lists (not only ``default``); valid data
is refused only with 404, 409 or 422 (the repository's schemathesis.toml, which a
client's command line run reads too), and a 422 names only fields the operation lists
in ``x-server-checks`` (those only the hub can judge: a name that must exist, a
certificate that must parse). Bounded: a few
examples per operation and phase, no deadline (shared CI machines), on whichever
backend the suite runs on: about 10,000 requests, two minutes of one core here."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import b2bhub_testplugins as testplugins
import pytest
import requests
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events, from_schema
from sqlalchemy import update

from b2bhub.api.blueprint import SERVER_CHECKS
from b2bhub.models import ApiToken
from b2bhub.plugin.registry import PluginRegistry
from b2bhub.services.tokens import new_token
from plugins.as2 import profiles
from plugins.as2.plugin import As2Sender
from plugins.file_poller import FilePoller
from plugins.http_poster import HttpPoster
from tests.as2kit import make_pair

ROOT = Path(__file__).resolve().parent.parent
# far from the small ids the generator tries first, so DELETE /tokens/{id} does not
# revoke the token the run itself uses
TOKEN_ID = 987_654_321
EXAMPLES = 20  # per operation and phase

#: calls that answer a stream of Server-Sent Events: a stream does not end by itself
#: (tests/test_events.py and tests/test_live_api.py cover them)
STREAMING_PATHS = ("/api/v1/events", "/api/v1/logs/stream")


@pytest.fixture
def registry():
    """One plugin type of each shape an instance's body and answer take: manual_source
    (no settings; the run's inbox), recorder (required settings; its writer), as2_sender
    (optional settings only: a choice and integers), file_poller (a required path, a
    boolean) and http_poster (a setting of every kind: string, path, integer, number,
    boolean, choice, json, secret). The document writes every type's variants with one
    function (``document_plugin_configs``), and the coverage phase sends some 300 cases
    of the fields all variants share (name, enabled, ...) for each type it finds: three
    more types of shapes already here (the test types noop and external_echo, no
    settings; as2_receiver, optional integers) made 1,800 of the run's 12,000 requests."""
    reg = PluginRegistry()
    for cls in (testplugins.ManualSource, testplugins.Recorder, As2Sender, FilePoller,
                HttpPoster):
        reg.register(cls)
    return reg


class RefusalNotDocumented(AssertionError):
    pass


class ValidDataRefused(AssertionError):
    pass


def _operation(case) -> dict:
    return case.operation.definition.raw


@schemathesis.check
def refusal_is_documented(ctx, response, case):
    """A 4xx answer is one the operation lists, not only covered by ``default``."""
    if 400 <= response.status_code < 500 and response.status_code not in (405, 406):
        listed = set(_operation(case).get("responses", {}))
        if str(response.status_code) not in listed:
            raise RefusalNotDocumented(
                f"{case.method} {case.path} answered {response.status_code}, which it does "
                f"not list (lists {sorted(listed)}): {response.content[:300]!r}")


@schemathesis.check
def no_content_has_no_type(ctx, response, case):
    """A 204 has neither a body nor a content type."""
    if response.status_code == 204 and (response.content or response.headers.get(
            "content-type")):
        raise AssertionError(f"{case.method} {case.path}: 204 with {response.headers}")


@schemathesis.check
def valid_data_is_refused_only_by_server_checks(ctx, response, case):
    """Beside positive_data_acceptance (which takes a 422 for valid data): a 422 names
    only fields the operation lists in ``x-server-checks``."""
    meta = case.meta
    if response.status_code != 422 or meta is None or not meta.generation.mode.is_positive:
        return
    checked = _operation(case).get(SERVER_CHECKS) or []
    details = json.loads(response.content)["error"]["details"]
    if not details or not set(details) <= set(checked):
        raise ValidDataRefused(
            f"{case.method} {case.path}: schema-valid data refused naming "
            f"{sorted(details) or 'no field'}, not only {checked}: {response.content[:300]!r}")


def _config(token: str) -> SchemathesisConfig:
    """The repository's schemathesis.toml (what a client runs from the command line),
    with this run's token and bounds."""
    with open(ROOT / "schemathesis.toml", "rb") as f:
        shared = tomllib.load(f)
    return SchemathesisConfig.from_dict({
        **shared,
        "headers": {"Authorization": f"Bearer {token}"},
        "workers": 1,
        "generation": {"max-examples": EXAMPLES, "mode": "all", "database": "none",
                       "deterministic": True},
        # the stateful phase chains calls by the links it infers (Location, ids)
        "phases": {"stateful": {"enabled": True, "max-steps": 6}},
    })


def _answer(recorder, case_id: str) -> str:
    interaction = recorder.interactions.get(case_id)
    if interaction is None or interaction.response is None:
        return "no answer"
    response = interaction.response
    return f"{response.status_code} {response.content[:300]!r}"


def failures(schema) -> list[str]:
    """Each failed check of the run, with its request and answer."""
    found = []
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for case_id, nodes in event.recorder.checks.items():
                for node in nodes:
                    if node.status == Status.FAILURE:
                        case = event.recorder.cases[case_id].value
                        failure = node.failure_info.failure
                        found.append(f"[{node.name}] {case.method} {case.formatted_path} "
                                     f"query={case.query} body={str(case.body)[:200]}: "
                                     f"{failure.title}: {failure.message[:300]} -> "
                                     f"{_answer(event.recorder, case_id)}")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            found.append(f"{getattr(event, 'label', '')}: error {event.info.message}")
    return found


def test_api_conforms_to_its_openapi_document(served, hub, record_dir, session):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    ours, theirs = make_pair("hub"), make_pair("acme")
    profiles.save_profile(session, "organization", "mycompany", {
        "as2_id": "HUB", "certificate": {"pem": ours[0], "private_key_pem": ours[1]}})
    profiles.save_profile(session, "partner", "acme", {
        "as2_id": "ACME", "url": "http://127.0.0.1:9/as2", "certificate": {"pem": theirs[0]}})
    hub.instance("inbox", "manual_source")
    hub.instance("writer", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer")
    hub.message()
    row, token = new_token(session, "fuzz", "admin")
    session.execute(update(ApiToken).where(ApiToken.id == row.id).values(id=TOKEN_ID))
    session.commit()
    doc = requests.get(served + "/api/v1/openapi.json", timeout=30).json()
    server_checked = [operation["operationId"] for item in doc["paths"].values()
                      for operation in item.values()
                      if isinstance(operation, dict) and SERVER_CHECKS in operation]
    assert {"create_route", "put_partner_as2_profile"} <= set(server_checked)

    schema = schemathesis.openapi.from_url(served + "/api/v1/openapi.json",
                                           config=_config(token))
    schema = schema.exclude(path=list(STREAMING_PATHS))
    operations = list(schema.get_all_operations())
    assert len(operations) >= 60
    found = failures(schema)
    assert not found, f"{len(found)} failed checks:\n" + "\n".join(found)
