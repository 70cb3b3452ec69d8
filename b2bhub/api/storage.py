"""``GET /storage``: the storage report (``b2bhub.services.storage``)."""

from __future__ import annotations

from flask import jsonify

from b2bhub.api import bp
from b2bhub.api.shapes import iso
from b2bhub.extensions import db
from b2bhub.services.storage import iso_moments, storage_report


@bp.get("/storage")
def get_storage():
    """Count and bytes of the messages kept by party, source and target, each source's
    retention (``retention_days`` null: kept forever) and oldest message, and the
    payload store against what the rows reference, as of the last cleanup run."""
    report = storage_report(db.session)
    db.session.rollback()
    return jsonify(iso_moments(report, iso))
