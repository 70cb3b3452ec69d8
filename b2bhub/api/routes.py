"""Health (no token)."""

from __future__ import annotations

from flask import jsonify
from sqlalchemy import text

from b2bhub.api import bp
from b2bhub.api.auth import public
from b2bhub.extensions import db


@bp.get("/health")
@public
def health():
    """Liveness of the web process and its database."""
    db.session.execute(text("SELECT 1"))
    return jsonify({"status": "ok", "database": db.engine.dialect.name})
