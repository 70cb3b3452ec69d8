"""Bearer tokens and roles for every API call (SPEC 15).

A user logged in to the UI may also read (GET) with the login session.
Reads need ``viewer``; any other method needs ``admin`` unless the view says otherwise
with :func:`requires`, so a new write endpoint is closed until it names its role.
:func:`public` opens a view to callers without a token (health only). The OpenAPI
document shows each call's role as ``x-required-role`` (see ``b2bhub.api.blueprint``).
"""

from __future__ import annotations

from collections.abc import Callable

from flask import current_app, g, request
from flask_login import current_user

from b2bhub.api.blueprint import READ_METHODS, ApiError, bp, role_for
from b2bhub.config.extensions import db
from b2bhub.services import tokens

RANK = {role: rank for rank, role in enumerate(tokens.ROLES)}


def requires(role: str) -> Callable:
    """Mark a view as needing at least ``role``; put it under the route decorator."""
    if role not in RANK:
        raise ValueError(f"unknown role {role!r}")

    def mark(view: Callable) -> Callable:
        view.required_role = role
        return view
    return mark


def public(view: Callable) -> Callable:
    """Mark a view as open to callers without a token."""
    view.public = True
    return view


@bp.before_request
def authenticate_request() -> None:
    """Refuse a missing or unknown token (401) or a role too low (403); set ``g.actor``."""
    view = current_app.view_functions.get(request.endpoint or "")
    if view is None:
        return
    needed = role_for(view, request.method)
    if needed is None:
        return
    token = _bearer_token()
    found = tokens.authenticate(db.session, token) if token else _ui_session()
    if found is None:
        raise ApiError(401, "unauthorized", "a valid bearer token is required "
                       "(Authorization: Bearer <token>)" if token is None
                       else "the bearer token is unknown or revoked")
    db.session.commit()
    _row, actor, role = found
    if RANK.get(role, -1) < RANK[needed]:
        raise ApiError(403, "forbidden", f"this call needs the {needed} role; "
                       f"'{actor}' has the {role} role")
    g.actor, g.role = actor, role


def _ui_session() -> tuple[None, str, str] | None:
    """A user logged in to the UI may read without a token (the pages' event stream,
    stats and payload downloads); writes always need a bearer token."""
    if request.method in READ_METHODS and current_user.is_authenticated:
        return None, current_user.name, current_user.role
    return None


def _bearer_token() -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
