"""Health (no token)."""

from __future__ import annotations

from marshmallow import Schema, fields
from sqlalchemy import text

from b2bhub.api.auth import public
from b2bhub.api.blueprint import bp
from b2bhub.config.extensions import db


class Health(Schema):
    status = fields.String(required=True)
    database = fields.String(required=True, metadata={"description": "sqlite or postgresql"})


@bp.get("/health", summary="Check the web process and its database")
@public
@bp.response(200, Health)
def health():
    """Liveness of the web process and its database."""
    db.session.execute(text("SELECT 1"))
    return {"status": "ok", "database": db.engine.dialect.name}
