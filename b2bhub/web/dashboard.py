"""The dashboard: counts by status, instance states, open alerts, charts."""

from __future__ import annotations

from datetime import timedelta

from flask import render_template, request
from flask_babel import gettext as _

from b2bhub.config.extensions import db
from b2bhub.domain.states import MessageStatus
from b2bhub.engine import blocking, stats
from b2bhub.models import utcnow
from b2bhub.services import alerts as alert_svc
from b2bhub.services import config as config_svc
from b2bhub.services import overview
from b2bhub.services import profiles as profile_svc
from b2bhub.web.charts import line_chart
from b2bhub.web.kit import bp

SPANS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}


@bp.get("/")
def dashboard():
    span_name = request.args.get("span") if request.args.get("span") in SPANS else "hour"
    span, now = SPANS[span_name], utcnow()
    figures = stats.current(db.session, now)
    points = stats.series(db.session, now, span)
    start = now.replace(second=0, microsecond=0) - span
    charts = [
        (_("Messages in and delivered per minute"), line_chart(
            points, [("messages_in", _("in")), ("delivered", _("delivered"))], start, span)),
        (_("Failed attempts per minute"), line_chart(
            points, [("failures", _("failures"))], start, span)),
        (_("Oldest due delivery (seconds waiting)"), line_chart(
            points, [("oldest_due_seconds", _("oldest due"))], start, span, " s")),
    ]
    return render_template("ui/dashboard.html", counts=figures.messages,
                           statuses=list(MessageStatus), total=sum(figures.messages.values()),
                           due=figures.due, oldest_due=figures.oldest_due_seconds,
                           instances=config_svc.list_instances(db.session, 1000).items,
                           blocked=blocking.blocked_instances(db.session),
                           alerts=alert_svc.open_alerts(db.session, 10),
                           open_alerts=overview.open_alert_count(db.session),
                           charts=charts, span=span_name,
                           ending=profile_svc.ending_certificates(db.session, now))
