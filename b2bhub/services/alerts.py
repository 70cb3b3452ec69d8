"""Alerts (SPEC 14): the open ones, and acknowledging one in the name of a user."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.engine.history import add_line
from b2bhub.models import Alert
from b2bhub.services.errors import Conflict, NotFound


def open_alerts(session: Session, limit: int = 500) -> list[Alert]:
    """Alerts whose condition still holds, newest first (acknowledged ones included)."""
    return list(session.scalars(select(Alert).where(Alert.resolved_at.is_(None))
                                .order_by(Alert.id.desc()).limit(limit)))


def acknowledge(session: Session, alert_id: int, actor: str, now: datetime) -> Alert:
    """Mark an open alert as seen by ``actor``; a history line says who (on the message's
    history when the alert is about one)."""
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFound(f"no alert {alert_id}")
    if alert.acknowledged_at is not None:
        raise Conflict(f"alert {alert_id} was acknowledged by {alert.acknowledged_by} "
                       "already")
    alert.acknowledged_at, alert.acknowledged_by = now, actor
    add_line(session, alert.message_id, "alert_acknowledged",
             f"{actor} acknowledged the {alert.kind} alert: {alert.text}", actor=actor,
             now=now, data={"alert": alert.id, "kind": alert.kind})
    return alert
