"""The REST API under /api/v1, documented at /api/v1/openapi.json."""

from b2bhub.api.blueprint import ApiBlueprint

bp = ApiBlueprint("api", __name__, url_prefix="/api/v1", description="b2bhub REST API")

from b2bhub.api import (  # noqa: E402,F401
    actions,
    admin,
    alerts,
    auth,
    errors,
    events,
    logs,
    messages,
    notifications,
    parties,
    plugins,
    processes,
    routes,
    routing,
    stats,
    storage,
)
