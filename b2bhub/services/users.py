"""Users: names, roles and passwords for the UI and for tokens that act as a person.

Passwords are hashed with scrypt (werkzeug's default KDF, n=2**15, r=8, p=1): a modern
memory-hard KDF that needs no extra dependency. A disabled user cannot log in and
their tokens stop working.
"""

from __future__ import annotations

import re

from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from b2bhub.models import User, utcnow
from b2bhub.services.errors import Conflict, ServiceError
from b2bhub.services.tokens import ROLES

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
MIN_PASSWORD = 8
# A hash to check against when the name is unknown, so a wrong name costs as long as a
# wrong password and timing tells nothing about which names exist.
_DUMMY_HASH = generate_password_hash("not a password of anyone")


def validate(name: str, password: str | None, role: str) -> None:
    if not NAME_RE.match(name or ""):
        msg = "a user name is 1-64 letters, digits or . _ @ - and starts with one of the first two"
        raise ServiceError(msg, {"name": msg})
    if role not in ROLES:
        msg = f"role must be one of {', '.join(ROLES)}"
        raise ServiceError(msg, {"role": msg})
    if password is not None and len(password) < MIN_PASSWORD:
        msg = f"a password has at least {MIN_PASSWORD} characters"
        raise ServiceError(msg, {"password": msg})


def create_user(session: Session, name: str, password: str, role: str = "viewer") -> User:
    validate(name, password, role)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(f"a user named '{name}' exists already", {"name": "taken"})
    user = User(name=name, password_hash=generate_password_hash(password), role=role)
    session.add(user)
    session.flush()
    return user


def set_password(user: User, password: str) -> None:
    validate(user.name, password, user.role)
    user.password_hash = generate_password_hash(password)


def check_login(session: Session, name: str, password: str) -> User | None:
    """The enabled user with this name and password, or None (either was wrong)."""
    user = session.scalar(select(User).where(User.name == name))
    if user is None or user.disabled_at is not None:
        check_password_hash(_DUMMY_HASH, password)
        return None
    if not check_password_hash(user.password_hash, password):
        return None
    user.last_login_at = utcnow()
    return user


def find_user(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))
