"""Reading requests for the views without a marshmallow schema (the event stream's
filters, the bodies of profiles of the kinds plugins add). The other views declare
their input in :mod:`b2bhub.api.schemas`.

Every refusal is an :class:`ApiError` 400 that says which field is wrong and why.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import request

from b2bhub.api.errors import ApiError


def bad_request(message: str, field: str | None = None) -> ApiError:
    return ApiError(400, "invalid", message, {field: message} if field else None)


def json_object(allowed: Iterable[str], required: Iterable[str] = ()) -> dict[str, Any]:
    """The request body as a JSON object with only ``allowed`` keys and every ``required``."""
    body = request.get_json(force=True, silent=True)
    if body is None and request.get_data():
        raise bad_request("the request body is not valid JSON")
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise bad_request(f"unknown field(s): {', '.join(unknown)}")
    missing = [name for name in required if name not in body]
    if missing:
        raise bad_request(f"missing field(s): {', '.join(missing)}")
    return body


def list_arg(name: str) -> list[str] | None:
    """A filter that takes several values, comma-separated (``status=error,stalled``)."""
    value = request.args.get(name)
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def int_arg(name: str) -> int | None:
    value = request.args.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f"{name} must be a whole number", name) from None
