"""The dashboard's count of alerts nobody has acknowledged yet."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.models import Alert


def open_alert_count(session: Session) -> int:
    return session.scalar(select(func.count(Alert.id)).where(
        Alert.resolved_at.is_(None), Alert.acknowledged_at.is_(None))) or 0
