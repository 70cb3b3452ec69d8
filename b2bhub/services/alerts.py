"""Alerts (SPEC 14): the list and acknowledging one, a history line naming who did."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.engine.history import add_line
from b2bhub.engine.notifications import message_statuses
from b2bhub.models import Alert
from b2bhub.models.pages import Page, keyset_page
from b2bhub.services.errors import Conflict, NotFound

log = logging.getLogger(__name__)

STATES = ("open", "unacknowledged", "resolved", "all")


def list_alerts(session: Session, state: str, kind: str | None, limit: int,
                after: int | None = None) -> Page:
    """Alerts newest first. ``state``: open (not resolved), unacknowledged (open and not
    acknowledged), resolved, or all."""
    stmt = select(Alert)
    if state in ("open", "unacknowledged"):
        stmt = stmt.where(Alert.resolved_at.is_(None))
    if state == "unacknowledged":
        stmt = stmt.where(Alert.acknowledged_at.is_(None))
    if state == "resolved":
        stmt = stmt.where(Alert.resolved_at.is_not(None))
    if kind:
        stmt = stmt.where(Alert.kind == kind)
    return keyset_page(session, stmt, Alert.id, limit, after, descending=True)


def attach_message_status(session: Session, alerts: list[Alert]) -> list[Alert]:
    """Give each alert ``message_status``: the current status of the message it is
    about (None for an alert about no message, or one whose message is gone); one read."""
    statuses = message_statuses(session, alerts)
    for alert in alerts:
        alert.message_status = statuses.get(alert.message_id)
    return alerts


def open_alerts(session: Session, limit: int = 500) -> list[Alert]:
    """Alerts whose condition still holds, newest first (acknowledged ones included)."""
    return list(session.scalars(select(Alert).where(Alert.resolved_at.is_(None))
                                .order_by(Alert.id.desc()).limit(limit)))


def acknowledge(session: Session, alert_id: int, actor: str, now: datetime) -> Alert:
    """Mark an alert seen by ``actor``. It stays open until its condition is gone."""
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFound(N_("no alert %(id)s", id=alert_id))
    if alert.acknowledged_at is not None:
        raise Conflict(N_("alert %(id)s was acknowledged by %(actor)s at %(when)s UTC",
                          id=alert_id, actor=alert.acknowledged_by,
                          when=f"{alert.acknowledged_at:%Y-%m-%d %H:%M:%S}"),
                       code="already_acknowledged")
    alert.acknowledged_at, alert.acknowledged_by = now, actor
    add_line(session, alert.message_id, "alert_acknowledged",
             f"{actor} acknowledged alert {alert.id} ({alert.kind}: {alert.text})",
             actor=actor, now=now, data={"alert": alert.id, "kind": alert.kind,
                                         "subject": alert.subject})
    log.info("%s acknowledged alert %s (%s %s)", actor, alert.id, alert.kind, alert.subject)
    return alert
