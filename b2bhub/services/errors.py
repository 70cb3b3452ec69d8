"""Errors the services raise for bad input; the API and CLI show them as they are."""

from __future__ import annotations


class ServiceError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, details: dict | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.details = message, details or {}
        if code:
            self.code = code


class NotFound(ServiceError):
    status, code = 404, "not_found"


class Conflict(ServiceError):
    status, code = 409, "conflict"
