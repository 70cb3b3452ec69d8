"""API bearer tokens: only a hash is stored; the token is shown once."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.models import ApiToken, User, utcnow
from b2bhub.models.pages import Page
from b2bhub.services.errors import Conflict, NotFound

ROLES = ("viewer", "operator", "admin")
LAST_USED_PRECISION = timedelta(minutes=1)


#: A live token by its hash, with its user if it has one, the statement every API request
#: runs first. Built once: building it and its cache key per call was a third of the
#: check's CPU (``python bench/api_auth.py --backend embedded postgres``, 2026-12-07,
#: load 1.1: 235-239 us a call on SQLite against 347-441 built per call; 709-713 us on
#: PostgreSQL against 880-1,385).
_LIVE_TOKEN = (select(ApiToken, User).outerjoin(User, User.id == ApiToken.user_id)
               .where(ApiToken.token_hash == bindparam("token_hash"),
                      ApiToken.revoked_at.is_(None)))


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, role: str = "admin",
                 user: User | None = None) -> str:
    """A new token, returned once. A user's token takes the user's role and name."""
    return new_token(session, name, role, user)[1]


def new_token(session: Session, name: str, role: str = "admin",
              user: User | None = None) -> tuple[ApiToken, str]:
    """The new token's row (flushed, ``user_name`` set) and the token itself."""
    if user is not None:
        role = user.role
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    token = "b2b_" + secrets.token_urlsafe(32)
    row = ApiToken(name=name, token_hash=_hash(token), role=role,
                   user_id=user.id if user is not None else None)
    session.add(row)
    session.flush()
    row.user_name = user.name if user is not None else None
    return row, token


def list_tokens(session: Session, limit: int, after: int | None = None,
                revoked: bool = False) -> Page:
    """Tokens by id, each with ``user_name`` set (None for a token of its own)."""
    stmt = select(ApiToken, User.name).outerjoin(User, User.id == ApiToken.user_id)
    if not revoked:
        stmt = stmt.where(ApiToken.revoked_at.is_(None))
    if after is not None:
        stmt = stmt.where(ApiToken.id > after)
    rows = session.execute(stmt.order_by(ApiToken.id).limit(limit + 1)).all()
    for row, user_name in rows:
        row.user_name = user_name
    items = [row for row, _name in rows[:limit]]
    return Page(items, items[-1].id if len(rows) > limit else None)


def revoke_token(session: Session, token_id: int, now: datetime) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(N_("no token %(id)s", id=token_id))
    if row.revoked_at is not None:
        raise Conflict(N_("token %(id)s (%(name)s) was revoked already", id=token_id,
                          name=row.name),
                       code="already_revoked")
    row.revoked_at = now
    return row


def authenticate(session: Session, token: str) -> tuple[ApiToken, str, str] | None:
    """``(token row, actor, role)`` for a live token, or None; notes when it was last used.

    A token that belongs to a user acts as that user with the user's current role (so a
    changed role applies to existing tokens) and stops working when the user is disabled.
    """
    found = session.execute(_LIVE_TOKEN, {"token_hash": _hash(token)}).first()
    if found is None:
        return None
    row, user = found
    if user is not None and user.disabled_at is not None:
        return None
    actor, role = (user.name, user.role) if user is not None else (row.name, row.role)
    now = utcnow()
    # At most one write a minute per token: an API read should not cost a database write.
    if row is not None and (row.last_used_at is None or
                            now - row.last_used_at > LAST_USED_PRECISION):
        row.last_used_at = now
    return row, actor, role
