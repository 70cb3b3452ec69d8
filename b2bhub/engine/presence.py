"""Connected processes (System > Services) and their log records (the Logs page).

Every web, worker and beat process keeps a row in ``processes`` up to date from a
background thread (``b2bhub.runtime.agent``): its kind, host, pid, start, the instances it
runs, and ``last_seen`` at every heartbeat. A process that stops cleanly sets
``stopped_at``; one killed simply stops being seen and is shown as gone after
:data:`GONE_AFTER`. Rows of processes gone for a day, and log records beyond the
newest :data:`KEEP_LOG_RECORDS`, are removed by the periodic trim.

Known dead (SPEC 5): the sweep puts back at once the leases of a process that is
known dead (:func:`known_dead`), so its targets deliver again within seconds instead
of after the lease (``lease_seconds``, which stays the bound for a process alive but
hung). A process is known dead when

- it recorded its clean stop (``stopped_at``: the agent writes it after the worker's
  last settlement, as the process exits), or
- its last heartbeat is older than :data:`DEAD_AFTER` (three heartbeats missed in a
  row), while some other process has beaten without a gap for :data:`STEADY_FOR`.

Both times are the database's clock (:func:`database_now`): the heartbeat writes it and
the sweep compares with it, so clocks of different hosts, however far apart, never make
a live process look dead (a host clock stepped by minutes changes nothing). The second
condition keeps an outage of the database itself from reading as the death of every
process: then no process is steady until heartbeats have flowed again for
:data:`STEADY_FOR`, by which time every live process has beaten.

The heartbeat comes from the agent's own thread (``b2bhub.runtime.agent``), which keeps
beating while the worker's main thread runs an attempt of any length; its liveness
write is a transaction of its own that nothing else holds up. After kill -9 of a
worker its leases are put back within ``DEAD_AFTER`` + one heartbeat + one sweep
(5 s): 25 s at most, about 20 s on average, plus the wake-up and the new attempt.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, func, insert, or_, select, text, update
from sqlalchemy.orm import Session

from b2bhub.models import LogRecord, Process
from b2bhub.models.pages import Page, keyset_page

HEARTBEAT_SECONDS = 5.0
# this process's name in the processes table and as a lease owner (b2bhub.runtime.hub.process_owner)
PROCESS_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
GONE_AFTER = timedelta(seconds=3 * HEARTBEAT_SECONDS)
#: a process whose heartbeat is this old (by the database's clock) is known dead
DEAD_AFTER = GONE_AFTER
#: how long another process must have beaten without a gap before a missing heartbeat
#: is believed: two intervals, so every live process has beaten at least once meanwhile
STEADY_FOR = timedelta(seconds=2 * HEARTBEAT_SECONDS)
#: a heartbeat later than this after the one before starts the process's steady time anew
STEADY_GAP = 1.5 * HEARTBEAT_SECONDS
FORGET_AFTER = timedelta(days=1)
KEEP_LOG_RECORDS = 100_000


@dataclass(frozen=True)
class ProcessInfo:
    id: str
    kind: str  # web | worker | beat
    host: str
    pid: int
    started_at: datetime


def database_now(session: Session) -> datetime:
    """The database's clock (UTC, naive like every stored time): the one clock all
    processes share, whichever host they run on."""
    if session.get_bind().dialect.name == "postgresql":
        return session.scalar(text("SELECT timezone('UTC', clock_timestamp())"))
    value = session.scalar(text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"))
    return datetime.fromisoformat(value)


def heartbeat(session: Session, info: ProcessInfo, instances: list[str],
              now: datetime, steady_since: datetime | None = None) -> None:
    """Record that the process is alive and what it runs (insert the row the first time).

    ``now`` is the database's clock (:func:`database_now`) in the processes; tests pass
    times of their own. ``steady_since``: since when its heartbeats came without a gap
    (``now`` when not given)."""
    values = {"last_seen": now, "instances": sorted(instances), "stopped_at": None,
              "steady_since": steady_since or now}
    if session.execute(update(Process).where(Process.id == info.id)
                       .values(**values)).rowcount == 0:
        session.execute(insert(Process).values(
            id=info.id, kind=info.kind, host=info.host, pid=info.pid,
            started_at=info.started_at, **values))


def mark_stopped(session: Session, process_id: str, now: datetime) -> None:
    session.execute(update(Process).where(Process.id == process_id).values(
        stopped_at=now, last_seen=now, instances=[]))


def record_instances(session: Session, process_id: str, instances: list[str]) -> None:
    session.execute(update(Process).where(Process.id == process_id)
                    .values(instances=sorted(instances)))


def known_dead(db_now: datetime):
    """A SELECT of the ids of the processes known dead at ``db_now`` (the module's
    docstring says when that is)."""
    other = Process.__table__.alias("other")
    steady_witness = exists().where(
        other.c.id != Process.id, other.c.stopped_at.is_(None),
        other.c.last_seen >= db_now - timedelta(seconds=STEADY_GAP),
        other.c.steady_since <= db_now - STEADY_FOR)
    return select(Process.id).where(or_(
        Process.stopped_at.is_not(None),
        (Process.last_seen < db_now - DEAD_AFTER) & steady_witness))


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
