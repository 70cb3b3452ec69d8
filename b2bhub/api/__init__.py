"""The REST API under /api/v1."""

from flask import Blueprint

bp = Blueprint("api", __name__, url_prefix="/api/v1")

from b2bhub.api import (  # noqa: E402,F401
    actions,
    auth,
    errors,
    events,
    logs,
    messages,
    parties,
    plugins,
    processes,
    routes,
    routing,
    stats,
)
