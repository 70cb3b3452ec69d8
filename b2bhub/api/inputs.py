"""Reading requests for the views without a marshmallow schema (event and log streams,
processes, stats, AS2 profiles): a JSON object body, query filters, ``limit`` and
``cursor``. The other views declare their input in :mod:`b2bhub.api.schemas`.

Every refusal is an :class:`ApiError` 400 that says which field is wrong and why.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from typing import Any

from flask import request

from b2bhub.api.errors import ApiError

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


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


def text_arg(name: str) -> str | None:
    value = request.args.get(name)
    return value if value else None


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


def limit_arg() -> int:
    value = request.args.get("limit")
    if value is None:
        return DEFAULT_LIMIT
    if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise bad_request(f"limit must be a whole number from 1 to {MAX_LIMIT}", "limit")
    return int(value)


def cursor_arg(kind: type) -> Any:
    """The key the ``cursor`` argument stands for; it must be a ``kind`` (int or str)."""
    value = request.args.get("cursor")
    if not value:
        return None
    try:
        key = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError):
        key = None
    if not isinstance(key, kind) or isinstance(key, bool):
        raise bad_request("cursor is not one this list handed out", "cursor")
    return key
