"""History lines and alerts: written inside the transaction of the change they record."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from b2bhub.models import Alert, HistoryLine, utcnow

_INSERT_LINES = insert(HistoryLine.__table__)


def connection(session: Session) -> Connection:
    """The session's connection, for the hot paths of claim and settle: a Core statement
    on it costs a fraction of one through ``Session.execute``. Pending ORM changes are
    flushed first, so statements see them as they would through the session."""
    if session.new or session.dirty or session.deleted:
        session.flush()
    return session.connection()


def add_line(session: Session, message_id: int | None, type_: str, text: str = "", *,
             actor: str = "", delivery_id: int | None = None, data: dict | None = None,
             now: datetime | None = None) -> None:
    """Add one history line; its id becomes the SSE event id."""
    session.add(HistoryLine(message_id=message_id, delivery_id=delivery_id, type=type_,
                            actor=actor, text=text, data=data, created_at=now or utcnow()))


def add_lines(session: Session, rows: list[dict], now: datetime | None = None) -> None:
    """Insert many lines in one statement (claims and the sweep touch rows in batches)."""
    if not rows:
        return
    stamp = now or utcnow()
    full = [{"message_id": None, "delivery_id": None, "actor": "", "text": "", "data": None,
             "created_at": stamp, **row} for row in rows]
    # one Core executemany: the ORM's bulk insert splits rows by which keys are None
    # (a settlement's delivery line and status line became two statements)
    connection(session).execute(_INSERT_LINES, full)


def raise_alert(session: Session, kind: str, subject: str, text: str,
                message_id: int | None = None, now: datetime | None = None) -> bool:
    """Open an alert unless one of the same kind is open for the subject; True if new."""
    open_id = session.scalar(select(Alert.id).where(
        Alert.kind == kind, Alert.subject == subject, Alert.resolved_at.is_(None)).limit(1))
    if open_id is not None:
        return False
    session.add(Alert(kind=kind, subject=subject, text=text, message_id=message_id,
                      created_at=now or utcnow()))
    return True


def resolve_alert(session: Session, kind: str, subject: str,
                  now: datetime | None = None) -> None:
    """Close the open alert of this kind for the subject, when the condition is gone."""
    session.execute(update(Alert).where(
        Alert.kind == kind, Alert.subject == subject, Alert.resolved_at.is_(None),
    ).values(resolved_at=now or utcnow()))
