"""The REST API under /api/v1, documented at /api/v1/openapi.json."""

from b2bhub.api import (  # noqa: F401
    actions,
    admin,
    alerts,
    audit,
    auth,
    errors,
    events,
    expected,
    logs,
    messages,
    notifications,
    parties,
    plugins,
    processes,
    routes,
    routing,
    scorecard,
    stats,
    storage,
)
from b2bhub.api.blueprint import bp  # noqa: F401  (the views register on it)
