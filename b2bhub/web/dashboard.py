"""The dashboard: counts by status, instance states, open alerts, charts."""

from __future__ import annotations

from flask import render_template

from b2bhub.domain.states import MessageStatus
from b2bhub.extensions import db
from b2bhub.services import alerts as alert_svc
from b2bhub.services import config as config_svc
from b2bhub.services import overview
from b2bhub.web import bp


@bp.get("/")
def dashboard():
    counts = overview.messages_by_status(db.session)
    return render_template("ui/dashboard.html", counts=counts, statuses=list(MessageStatus),
                           total=sum(counts.values()),
                           instances=config_svc.list_instances(db.session, 1000).items,
                           alerts=alert_svc.open_alerts(db.session, 10),
                           open_alerts=overview.open_alert_count(db.session))
