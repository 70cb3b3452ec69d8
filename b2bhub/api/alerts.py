"""Alerts (SPEC 14): the list and acknowledging one."""

from __future__ import annotations

from flask import g

import b2bhub.api.schemas as s
from b2bhub.api.auth import requires
from b2bhub.api.blueprint import bp
from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services import alerts as svc


@bp.get("/alerts")
@bp.arguments(s.AlertArgs, location="query")
@bp.response(200, s.AlertPage)
def list_alerts(args: dict):
    """Alerts newest first, open ones unless ``state`` says otherwise."""
    page = svc.list_alerts(db.session, args["state"], args.get("kind"), args["limit"],
                           args.get("cursor"))
    svc.attach_message_status(db.session, page.items)
    return s.page_json(page)


@bp.post("/alerts/<int:alert_id>/acknowledge", summary="Acknowledge an alert",
         refusals=(409,))
@requires("operator")
@bp.response(200, s.Alert)
def acknowledge_alert(alert_id: int):
    """Mark the alert seen; a history line names who did. It stays open until its
    condition is gone. 409 ``already_acknowledged`` the second time."""
    alert = svc.acknowledge(db.session, alert_id, g.actor, utcnow())
    db.session.commit()
    return svc.attach_message_status(db.session, [alert])[0]
