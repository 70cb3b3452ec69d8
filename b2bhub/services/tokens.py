"""API bearer tokens: only a hash is stored; the token is shown once."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.models import ApiToken, utcnow

ROLES = ("viewer", "operator", "admin")
LAST_USED_PRECISION = timedelta(minutes=1)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, role: str = "admin") -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    token = "b2b_" + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, token_hash=_hash(token), role=role))
    return token


def authenticate(session: Session, token: str) -> ApiToken | None:
    """The live token row for ``token``, or None; notes when it was last used."""
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == _hash(token),
                                                ApiToken.revoked_at.is_(None)))
    now = utcnow()
    # At most one write a minute per token: an API read should not cost a database write.
    if row is not None and (row.last_used_at is None or
                            now - row.last_used_at > LAST_USED_PRECISION):
        row.last_used_at = now
    return row
