"""Errors as ``{"error": {"code", "message", "details"}}`` through one helper."""

from __future__ import annotations

from flask import jsonify
from werkzeug.exceptions import HTTPException

from b2bhub.api import bp


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


def error_response(status: int, code: str, message: str, details: dict | None = None):
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return jsonify(body), status


@bp.errorhandler(ApiError)
def _api_error(exc: ApiError):
    return error_response(exc.status, exc.code, exc.message, exc.details)


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException):
    code = (exc.name or "error").lower().replace(" ", "_")
    return error_response(exc.code or 500, code, exc.description or exc.name)
