"""Users and API tokens, for admins only (reads too). Every change is a history line
(without a message) naming the admin, and a log record."""

from __future__ import annotations

from flask import g, url_for

import b2bhub.api.schemas as s
from b2bhub.api.auth import requires
from b2bhub.api.blueprint import bp
from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services import tokens
from b2bhub.services import users as svc
from b2bhub.services.errors import ServiceError


@bp.get("/users")
@requires("admin")
@bp.arguments(s.NamePageArgs, location="query")
@bp.response(200, s.UserPage)
def list_users(args: dict):
    return s.page_json(svc.list_users(db.session, args["limit"], args.get("cursor")))


@bp.get("/users/<name>")
@requires("admin")
@bp.response(200, s.User)
def get_user(name: str):
    return svc.get_user(db.session, name)


@bp.post("/users", refusals=(409,))
@bp.arguments(s.UserCreate)
@bp.response(201, s.User)
def create_user(body: dict):
    """A user with a password (at least 8 characters; only its scrypt hash is kept)."""
    user = svc.add_user(db.session, body["name"], body["password"], body["role"],
                        g.actor, utcnow())
    db.session.commit()
    return user, 201, {"Location": url_for(".get_user", name=user.name)}


@bp.put("/users/<name>", refusals=(409,))
@bp.arguments(s.UserUpdate, required=False)  # every field may be left out
@bp.response(200, s.User)
def update_user(body: dict, name: str):
    """Change the role, set a new password, or disable (``disabled: true``: no login,
    the user's tokens stop working) or enable the user."""
    user = svc.change_user(db.session, name, body, g.actor, utcnow())
    db.session.commit()
    return user


@bp.delete("/users/<name>", refusals=(409,))
@bp.response(204)
def delete_user(name: str):
    """Delete the user and the user's tokens."""
    svc.delete_user(db.session, name, g.actor, utcnow())
    db.session.commit()


@bp.get("/tokens")
@requires("admin")
@bp.arguments(s.TokenArgs, location="query")
@bp.response(200, s.TokenPage)
def list_tokens(args: dict):
    """Tokens by id (never the token itself); revoked ones with ``revoked=true``."""
    return s.page_json(tokens.list_tokens(db.session, args["limit"], args.get("cursor"),
                                          args["revoked"]))


@bp.post("/tokens", refusals=(404,), server_checks=("role",))
@bp.arguments(s.TokenCreate)
@bp.response(201, s.TokenCreated)
def create_token(body: dict):
    """A new bearer token, shown in this answer only. With ``user`` it acts as that user
    (history lines name the user; the user's role applies)."""
    user = None
    if body.get("user"):
        user = svc.get_user(db.session, body["user"])
        if body.get("role") not in (None, user.role):
            raise ServiceError(f"a token of {user.name} has the user's role "
                               f"({user.role}); leave role out", {"role": "not with user"})
    row, token = tokens.new_token(db.session, body["name"], body.get("role", "viewer"), user)
    owner = f"acting as {user.name}" if user else f"with the {row.role} role"
    svc.audit(db.session, "token_created", f"{g.actor} created token {row.id} "
              f"'{row.name}' {owner}", g.actor, utcnow(), {"token": row.id})
    db.session.commit()
    row.token = token
    return row, 201


@bp.delete(f"/tokens/<{s.SMALL_ID}:token_id>", refusals=(409,))
@bp.response(204)
def revoke_token(token_id: int):
    """Revoke a token: it stops working at once. The row stays for the record."""
    row = tokens.revoke_token(db.session, token_id, utcnow())
    svc.audit(db.session, "token_revoked", f"{g.actor} revoked token {row.id} "
              f"'{row.name}'", g.actor, utcnow(), {"token": row.id})
    db.session.commit()
