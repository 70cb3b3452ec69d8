"""Errors as ``{"error": {"code", "message", "details"}}`` through one helper."""

from __future__ import annotations

from flask import jsonify, request
from sqlalchemy.exc import IntegrityError
from werkzeug.exceptions import HTTPException

from b2bhub.api.blueprint import ApiError, bp
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
    db.session.rollback()
    return error_response(exc.status, exc.code, exc.message, exc.details)


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
