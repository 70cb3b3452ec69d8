"""schemathesis against /api/v1/openapi.json: for generated requests to every documented
operation (valid ones and ones that break the schema), no answer is a 5xx, every answer's
status code, content type and body conform to the document, and data the document calls
invalid is refused. Bounded: a few examples per operation, no deadline (shared CI
machines), on whichever backend the suite runs on."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import update

from b2bhub.models import ApiToken
from b2bhub.services.tokens import new_token

# far from the small ids the generator tries first, so DELETE /tokens/{id} does not
# revoke the token the run itself uses
TOKEN_ID = 987_654_321
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]
EXAMPLES = 8  # per operation and mode


def _auth(case, header: dict) -> dict:
    """The token, unless the case is about a wrong or missing Authorization header."""
    meta = case.meta
    negated = meta is not None and any(
        location == ParameterLocation.HEADER and component.mode.is_negative
        for location, component in meta.components.items())
    return {} if negated else header


#: calls that answer a stream of Server-Sent Events, documented or not: in-process, a
#: stream that does not end would hold the run forever
STREAMING_PATHS = ("/api/v1/events", "/api/v1/logs/stream")


def _streams(operation) -> bool:
    """Operations answering a stream (Server-Sent Events) do not end by themselves."""
    if operation.path in STREAMING_PATHS:
        return True
    responses = operation.definition.raw.get("responses", {})
    return any("text/event-stream" in (r.get("content") or {}) for r in responses.values()
               if isinstance(r, dict))


@pytest.fixture
def api_schema(app, hub, record_dir):
    """The document as the app serves it, with a little data for the calls to find."""
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("inbox", "manual_source")
    hub.instance("writer", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer")
    hub.message()
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    return schema.exclude(func=lambda ctx: _streams(ctx.operation))


@pytest.fixture
def admin_header(session):
    row, token = new_token(session, "fuzz", "admin")
    session.execute(update(ApiToken).where(ApiToken.id == row.id).values(id=TOKEN_ID))
    session.commit()
    return {"Authorization": f"Bearer {token}"}


def test_api_conforms_to_its_openapi_document(api_schema, admin_header):
    """Every operation, valid and invalid requests. (schemathesis' pytest plugin is not
    used: it relies on a pytest internal that pytest 9 removed.)"""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 30
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                      database=None, suppress_health_check=list(HealthCheck))
            def check(case):
                case.call_and_validate(headers=_auth(case, admin_header), checks=CHECKS)
            try:
                check()
            except Unsatisfiable:
                # nothing of the operation can be made invalid (no parameters, no body)
                assert mode == GenerationMode.NEGATIVE, operation.label
