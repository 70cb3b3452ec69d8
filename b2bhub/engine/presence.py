"""Connected processes (System > Services) and their log records (the Logs page).

Every web, worker and beat process keeps a row in ``processes`` up to date from a
background thread (``b2bhub.agent``): its kind, host, pid, start, the instances it
runs, and ``last_seen`` at every heartbeat. A process that stops cleanly sets
``stopped_at``; one killed simply stops being seen and is shown as gone after
:data:`GONE_AFTER`. Rows of processes gone for a day, and log records beyond the
newest :data:`KEEP_LOG_RECORDS`, are removed by the periodic trim.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.orm import Session

from b2bhub.models import LogRecord, Process
from b2bhub.services.pages import Page, keyset_page

HEARTBEAT_SECONDS = 5.0
GONE_AFTER = timedelta(seconds=3 * HEARTBEAT_SECONDS)
FORGET_AFTER = timedelta(days=1)
KEEP_LOG_RECORDS = 100_000


@dataclass(frozen=True)
class ProcessInfo:
    id: str
    kind: str  # web | worker | beat
    host: str
    pid: int
    started_at: datetime


def heartbeat(session: Session, info: ProcessInfo, instances: list[str],
              now: datetime) -> None:
    """Record that the process is alive and what it runs (insert the row the first time)."""
    values = {"last_seen": now, "instances": sorted(instances), "stopped_at": None}
    if session.execute(update(Process).where(Process.id == info.id)
                       .values(**values)).rowcount == 0:
        session.execute(insert(Process).values(
            id=info.id, kind=info.kind, host=info.host, pid=info.pid,
            started_at=info.started_at, **values))


def mark_stopped(session: Session, process_id: str, now: datetime) -> None:
    session.execute(update(Process).where(Process.id == process_id).values(
        stopped_at=now, last_seen=now, instances=[]))


def process_state(row: Process, now: datetime) -> str:
    if row.stopped_at is not None:
        return "stopped"
    return "running" if now - row.last_seen <= GONE_AFTER else "gone"


def list_processes(session: Session, now: datetime, include_stopped: bool = False
                   ) -> list[Process]:
    """Connected processes, by kind and start; with those stopped or gone when asked."""
    stmt = select(Process).order_by(Process.kind, Process.started_at, Process.id)
    if not include_stopped:
        stmt = stmt.where(Process.stopped_at.is_(None), Process.last_seen >= now - GONE_AFTER)
    return list(session.scalars(stmt))


# --- log records --------------------------------------------------------------------

@dataclass
class LogFilter:
    min_level: int = 0
    process: str | None = None  # a process id, or a kind: web, worker, beat


def _filtered(stmt, filters: LogFilter):
    if filters.min_level:
        stmt = stmt.where(LogRecord.level >= filters.min_level)
    if filters.process:
        stmt = stmt.where(or_(LogRecord.process_id == filters.process,
                              LogRecord.kind == filters.process))
    return stmt


def list_log_records(session: Session, filters: LogFilter, limit: int,
                     before: int | None = None) -> Page:
    """A page of records, newest first."""
    return keyset_page(session, _filtered(select(LogRecord), filters), LogRecord.id, limit,
                       before, descending=True)


def latest_log_id(session: Session) -> int:
    return session.scalar(select(func.coalesce(func.max(LogRecord.id), 0)))


def level_number(name: str) -> int:
    """``info`` -> 20; a number given as text is taken as it is; ValueError if neither."""
    if name.isdigit():
        return int(name)
    number = logging.getLevelName(name.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {name!r}")
    return number


def trim(session: Session, now: datetime, keep: int = KEEP_LOG_RECORDS) -> int:
    """Forget processes gone for a day; keep the newest ``keep`` log records."""
    session.execute(delete(Process).where(Process.last_seen < now - FORGET_AFTER))
    top = latest_log_id(session)
    return session.execute(delete(LogRecord).where(LogRecord.id <= top - keep)).rowcount
