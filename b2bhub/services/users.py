"""Users: names, roles and passwords for the UI and for tokens that act as a person.

Passwords are hashed with scrypt (werkzeug's default KDF, n=2**15, r=8, p=1): a modern
memory-hard KDF that needs no extra dependency. A disabled user cannot log in and
their tokens stop working.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from b2bhub.domain.i18n import N_
from b2bhub.engine.history import add_line
from b2bhub.models import User, utcnow
from b2bhub.models.pages import Page, keyset_page
from b2bhub.services.errors import Conflict, NotFound, ServiceError
from b2bhub.services.tokens import ROLES

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
MIN_PASSWORD = 8


@functools.cache
def _dummy_hash() -> str:
    """A hash to check against when the name is unknown, so a wrong name costs as long
    as a wrong password and timing tells nothing about which names exist. Made at the
    first such login, not at import: the scrypt call costs 0.15 s of CPU, which every
    process importing this module (each worker, web and CLI start) paid before."""
    return generate_password_hash("not a password of anyone")


def validate(name: str, password: str | None, role: str) -> None:
    if not NAME_RE.fullmatch(name or ""):
        msg = N_("a user name is 1-64 letters, digits or . _ @ - and starts with one of the "
                 "first two")
        raise ServiceError(msg, {"name": msg})
    if role not in ROLES:
        msg = N_("role must be one of %(roles)s", roles=", ".join(ROLES))
        raise ServiceError(msg, {"role": msg})
    if password is not None and len(password) < MIN_PASSWORD:
        msg = N_("a password has at least %(least)s characters", least=MIN_PASSWORD)
        raise ServiceError(msg, {"password": msg})


def create_user(session: Session, name: str, password: str, role: str = "viewer") -> User:
    validate(name, password, role)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(N_("a user named '%(name)s' exists already", name=name),
                       {"name": "taken"})
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
        check_password_hash(_dummy_hash(), password)
        return None
    if not check_password_hash(user.password_hash, password):
        return None
    user.last_login_at = utcnow()
    return user


def find_user(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))


# --- administration through the API ---------------------------------------------------
# Each change is a history line (without a message) naming the admin, logged at info.

def audit(session: Session, type_: str, text: str, actor: str, now: datetime,
          data: dict | None = None) -> None:
    """Record an administrative action: a history line without a message (logged at
    info with it, :func:`b2bhub.engine.history.log_line`)."""
    add_line(session, None, type_, text, actor=actor, data=data, now=now)


def get_user(session: Session, name: str) -> User:
    user = find_user(session, name)
    if user is None:
        raise NotFound(N_("no user named '%(name)s'", name=name))
    return user


def list_users(session: Session, limit: int, after: str | None = None) -> Page:
    return keyset_page(session, select(User), User.name, limit, after)


def add_user(session: Session, name: str, password: str, role: str, actor: str,
             now: datetime) -> User:
    user = create_user(session, name, password, role)
    audit(session, "user_created", f"{actor} created user {name} ({role})", actor, now,
          {"user": name, "role": role})
    return user


def change_user(session: Session, name: str, changes: dict, actor: str,
                now: datetime) -> User:
    """Set ``role``, ``password`` and/or ``disabled``. Admins cannot demote or disable
    themselves, so a hub is not locked out by a slip."""
    user = get_user(session, name)
    if name == actor and (changes.get("disabled") or
                          changes.get("role", user.role) != user.role):
        raise Conflict(N_("you cannot disable yourself or change your own role; ask "
                          "another admin"), code="self_change")
    said = []
    if "role" in changes and changes["role"] != user.role:
        validate(user.name, None, changes["role"])
        said.append(f"role {user.role} -> {changes['role']}")
        user.role = changes["role"]
    if "password" in changes:
        set_password(user, changes["password"])
        said.append("password changed")
    if "disabled" in changes and changes["disabled"] != (user.disabled_at is not None):
        user.disabled_at = now if changes["disabled"] else None
        said.append("disabled" if changes["disabled"] else "enabled")
    if said:
        audit(session, "user_changed", f"{actor} changed user {name}: {', '.join(said)}",
              actor, now, {"user": name, "changes": said})
    return user


def delete_user(session: Session, name: str, actor: str, now: datetime) -> None:
    """Delete a user and the user's tokens; history lines keep the name."""
    if name == actor:
        raise Conflict(N_("you cannot delete yourself; ask another admin"),
                       code="self_change")
    session.delete(get_user(session, name))
    audit(session, "user_deleted", f"{actor} deleted user {name} and the user's tokens",
          actor, now, {"user": name})
