"""What the modules of the state machine share: recording a transition's history lines
with the statuses they derive, and telling the database the session is on."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from b2bhub.engine.status import refresh_statuses


def _record(session: Session, lines: list[dict], now: datetime) -> None:
    """Derive and store the status of the messages these lines are about, and write the
    lines ahead of the status lines, in one INSERT."""
    if lines:
        refresh_statuses(session, [line["message_id"] for line in lines], now, lines=lines)


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"
