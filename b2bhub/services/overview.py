"""What the dashboard counts: messages by status, instances by state, open alerts."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.models import Alert, Message


def messages_by_status(session: Session) -> dict[str, int]:
    return dict(session.execute(select(Message.status, func.count(Message.id))
                                .group_by(Message.status)).all())


def open_alert_count(session: Session) -> int:
    return session.scalar(select(func.count(Alert.id)).where(
        Alert.resolved_at.is_(None), Alert.acknowledged_at.is_(None))) or 0
