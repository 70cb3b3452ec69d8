"""``GET /storage``: the storage report (``b2bhub.services.storage``)."""

from __future__ import annotations

import b2bhub.api.schemas as s
from b2bhub.api.blueprint import bp
from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services.storage import storage_report


@bp.get("/storage", summary="The storage report")
@bp.arguments(s.StorageArgs, location="query")
@bp.response(200, s.Storage)
def get_storage(args: dict):
    """Count and bytes of the messages kept by party, source and target, each source's
    retention (``retention_days`` null: kept forever) and oldest message, and the
    payload store against what the rows reference, as of the last cleanup run. The
    figures are those computed at ``computed_at`` (every 5 minutes); ``?fresh=true``
    computes them for this request (over a second with a million messages)."""
    report = storage_report(db.session, utcnow(), fresh=args["fresh"] == "true")
    db.session.rollback()
    return report
