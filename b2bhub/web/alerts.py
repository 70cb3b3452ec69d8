"""Alerts: the open ones; acknowledge names the user."""

from __future__ import annotations

from flask import g, redirect, render_template, url_for
from flask_babel import lazy_gettext as _l

from b2bhub.config.extensions import db
from b2bhub.models import utcnow
from b2bhub.services import alerts as svc
from b2bhub.web.forms import ActionForm
from b2bhub.web.kit import bp, button, requires


@bp.get("/alerts")
def alerts():
    return render_template("ui/alerts.html", alerts=svc.open_alerts(db.session),
                           form=ActionForm())


@bp.post("/alerts/<int:alert_id>/acknowledge")
@requires("operator")
def acknowledge_alert(alert_id: int):
    button(lambda: svc.acknowledge(db.session, alert_id, g.actor, utcnow()),
           lambda _alert: _l("alert %(id)s acknowledged", id=alert_id), record=False)
    return redirect(url_for("ui.alerts"))
