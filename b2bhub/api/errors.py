"""Errors as ``{"error": {"code", "message", "details"}}`` through one helper."""

from __future__ import annotations

import re

from flask import current_app, jsonify, request
from sqlalchemy.exc import IntegrityError
from werkzeug.exceptions import HTTPException

from b2bhub.api.blueprint import SERVER_CHECKS, ApiError, bp
from b2bhub.config.extensions import db
from b2bhub.engine.operator import ActionRefused, ReceiptRefused, UnknownObject
from b2bhub.services.errors import ServiceError


def error_response(status: int, code: str, message: str, details: dict | None = None):
    """The one way the API answers with an error."""
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return jsonify(body), status


@bp.errorhandler(ApiError)
def api_error_response(exc: ApiError):
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    body, status = error_response(exc.status, exc.code, exc.message, exc.details)
    return body, status, headers


@bp.errorhandler(ServiceError)
def _service_error(exc: ServiceError):
    """A service's refusal. One of data the document calls valid (refused for what the
    hub holds: a name that must exist, a certificate that must parse) is 422; one of
    data the document also calls invalid is 400 (the schemas cannot say everything a
    service checks: a setting's JSON type inside a plugin type's ``config``); 404 and
    409 as the service says."""
    db.session.rollback()
    status = exc.status
    if status == 400 and exc.details and _valid_by_the_document():
        status = 422
    return error_response(status, exc.code, exc.message, exc.details)


def _valid_by_the_document() -> bool:
    """Whether the request's body is valid by its operation's schema in the served
    document (read only on this refusal's path); for an operation without a JSON body
    (a form, a query), whether the refusal named only its ``x-server-checks``.
    openapi-schema-validator (with jsonschema) is imported here, on the first refusal:
    at import it cost every web and CLI process about 0.1 s of its start."""
    from openapi_schema_validator import OAS30Validator
    document = current_app.extensions["b2bhub.api"].document()
    operation = _operation(document) or {}
    body_schema = operation.get("requestBody", {}).get("content", {}).get(
        "application/json", {}).get("schema")
    if body_schema is None:
        return bool(operation.get(SERVER_CHECKS)) and request.method != "GET"
    root = {**body_schema, "components": document.get("components", {})}
    return OAS30Validator(root).is_valid(request.get_json(silent=True))


def _operation(document: dict) -> dict | None:
    """The document's operation of this request: of the paths that match the request's,
    the most specific (a party's profile has a path per kind)."""
    method = request.method.lower()
    found = [(path.count("{"), item[method]) for path, item in document.get("paths", {}).items()
             if method in item and re.fullmatch(_pattern(path), request.path)]
    return min(found, key=lambda pair: pair[0])[1] if found else None


def _pattern(path: str) -> str:
    """A document's path as a regular expression: each ``{parameter}`` one segment."""
    return "".join("[^/]+" if part.startswith("{") else re.escape(part)
                   for part in re.split(r"(\{[^/{}]+\})", path))


@bp.errorhandler(ActionRefused)
def _action_refused(exc: ActionRefused):
    if isinstance(exc, ReceiptRefused):
        db.session.commit()  # the refused receipt stays on record
    else:
        db.session.rollback()
    return error_response(409, "action_refused", str(exc))


@bp.errorhandler(UnknownObject)
def _not_found(exc: UnknownObject):
    db.session.rollback()
    return error_response(404, "not_found", str(exc.args[0]) if exc.args else "not found")


@bp.errorhandler(IntegrityError)
def _integrity_error(exc: IntegrityError):
    # Two requests racing to create the same name: the database's constraint decides.
    db.session.rollback()
    return error_response(409, "conflict", "the change conflicts with data saved meanwhile")


#: the web UI's addresses: their errors are its pages (``b2bhub.web.kit``), not JSON
UI_PREFIX = "/ui"


@bp.app_errorhandler(HTTPException)
def http_error(exc: HTTPException):
    # App-wide, because a URL that matches no rule never reaches the blueprint's handlers.
    # Outside the UI the asker is a program (an API client, a partner's system at an
    # endpoint, a typo of either): it gets the API's JSON, not Werkzeug's bare page.
    if request.path == UI_PREFIX or request.path.startswith(UI_PREFIX + "/"):
        return exc
    code = (exc.name or "error").lower().replace(" ", "_")
    body, status = error_response(exc.code or 500, code, exc.description or exc.name)
    # what the exception says besides its body: Allow on a 405 (RFC 9110), for one
    headers = [(k, v) for k, v in exc.get_headers() if k.lower() != "content-type"]
    return body, status, headers
