"""Figures for the dashboard, ``GET /api/v1/stats`` and Prometheus ``/metrics``.

Current figures are counted at the moment they are asked for, on the indexes the
engine already keeps: messages by status (``ix_messages_status_id``), deliveries by
state and the due ones (``ix_deliveries_state_due``), instances by state with the
last probe of each (``b2bhub.engine.probes``), connected processes.

The per-minute series (messages in, attempts, delivered, failures, attempt durations,
due deliveries and the age of the oldest) come from ``stats_minutes``, which the
``housekeeping`` task fills once a minute for each minute that has ended
(:func:`sample_minutes`). A minute's attempts are read from the history lines of that
minute: a claim writes ``attempt N started`` (state ``in_progress``) and a settlement
a line with the new state and the attempt number, so an attempt's duration is the time
between the two lines. The lines of a minute are found by id (a binary search on the
primary key for the first line at or after a time), so a sample never scans the table.
The due figures can only be seen as they are: a minute sampled late (after a pause
of the beat) has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.domain.states import DeliveryState as S
from b2bhub.domain.states import MessageStatus
from b2bhub.engine import presence
from b2bhub.models import Delivery, HistoryLine, Message, PluginInstance, StatsMinute

DUE_STATES = (S.QUEUED, S.RETRYING)
CATCH_UP_MINUTES = 10
LAST_MINUTE = timedelta(minutes=2)  # the last ended minute is within this span
SETTLED_STATES = {S.DELIVERED, S.AWAITING_RECEIPT, S.FAILED, S.RETRYING}


class InstanceFigures(NamedTuple):
    name: str
    state: str
    enabled: bool
    online: bool | None  # the last probe (b2bhub.engine.probes); None: never, or no probe
    probe_checked_at: datetime | None


@dataclass
class Current:
    messages: dict[str, int]
    deliveries: dict[str, int]
    instances: dict[str, int]
    instance_states: list[InstanceFigures]
    blocked: dict[str, int]  # instance name: the delivery whose business error blocks it
    due: int
    oldest_due_seconds: float | None
    processes: dict[str, int]


def current(session: Session, now: datetime) -> Current:
    messages = dict.fromkeys(MessageStatus, 0) | dict(session.execute(
        select(Message.status, func.count()).group_by(Message.status)).all())
    deliveries = dict.fromkeys(S, 0) | dict(session.execute(
        select(Delivery.state, func.count()).group_by(Delivery.state)).all())
    instance_rows = session.execute(select(
        PluginInstance.name, PluginInstance.state, PluginInstance.enabled,
        PluginInstance.online, PluginInstance.probe_checked_at,
        PluginInstance.blocked_by_delivery_id).order_by(PluginInstance.name)).all()
    instances: dict[str, int] = {}
    for row in instance_rows:
        instances[row.state] = instances.get(row.state, 0) + 1
    blocked = {row.name: row.blocked_by_delivery_id for row in instance_rows
               if row.blocked_by_delivery_id is not None}
    due, oldest = due_now(session, now)
    processes: dict[str, int] = {}
    for row in presence.list_processes(session, now):
        processes[row.kind] = processes.get(row.kind, 0) + 1
    return Current({str(k): v for k, v in messages.items()},
                   {str(k): v for k, v in deliveries.items()}, instances,
                   [InstanceFigures(*row[:5]) for row in instance_rows], blocked, due,
                   oldest, processes)


def due_now(session: Session, now: datetime) -> tuple[int, float | None]:
    """Deliveries waiting for a claim whose time has come, and the oldest one's wait."""
    count, oldest = session.execute(select(func.count(), func.min(Delivery.due_at)).where(
        Delivery.state.in_(DUE_STATES), Delivery.due_at <= now)).one()
    return count, (now - oldest).total_seconds() if oldest is not None else None


def series(session: Session, now: datetime, span: timedelta) -> list[StatsMinute]:
    return list(session.scalars(select(StatsMinute).where(
        StatsMinute.minute >= _minute(now) - span).order_by(StatsMinute.minute)))


# --- the sampler --------------------------------------------------------------------

def sample_minutes(session: Session, now: datetime) -> int:
    """Write the ``stats_minutes`` rows of the minutes that ended since the last sample
    (at most :data:`CATCH_UP_MINUTES`); the caller commits. Returns how many."""
    this_minute = _minute(now)
    last = session.scalar(select(func.max(StatsMinute.minute)))
    first = this_minute - timedelta(minutes=CATCH_UP_MINUTES)
    if last is not None:
        first = max(first, last + timedelta(minutes=1))
    minutes = []
    minute = first
    while minute < this_minute:
        minutes.append(minute)
        minute += timedelta(minutes=1)
    if not minutes:
        return 0
    due, oldest = due_now(session, now)
    for minute in minutes:
        row = _sample(session, minute)
        if minute == minutes[-1]:
            row.due, row.oldest_due_seconds = due, oldest
        session.add(row)
    session.flush()
    return len(minutes)


def _sample(session: Session, minute: datetime) -> StatsMinute:
    end = minute + timedelta(minutes=1)
    messages_in = session.scalar(select(func.count()).select_from(Message).where(
        Message.created_at >= minute, Message.created_at < end))
    # claims up to a lease before the minute may be settled in it
    first = first_id_since(session, minute - timedelta(minutes=10))
    start, stop = first_id_since(session, minute), first_id_since(session, end)
    rows = session.execute(select(
        HistoryLine.id, HistoryLine.delivery_id, HistoryLine.created_at, HistoryLine.data)
        .where(HistoryLine.id >= first, HistoryLine.id < stop,
               HistoryLine.type == "delivery_changed", HistoryLine.delivery_id.is_not(None))
        .order_by(HistoryLine.id)).all()
    started: dict[tuple[int, int], datetime] = {}
    attempts = delivered = failures = 0
    durations: list[float] = []
    for line_id, delivery_id, at, data in rows:
        data = data or {}
        state, attempt = data.get("state"), data.get("attempt")
        if state == S.IN_PROGRESS:
            started[(delivery_id, attempt)] = at
            attempts += line_id >= start
        elif line_id >= start and state in SETTLED_STATES and attempt is not None:
            delivered += state == S.DELIVERED
            failures += state in (S.FAILED, S.RETRYING)
            began = started.get((delivery_id, attempt))
            if began is not None:
                durations.append((at - began).total_seconds())
    return StatsMinute(
        minute=minute, messages_in=messages_in, attempts=attempts, delivered=delivered,
        failures=failures,
        duration_avg=sum(durations) / len(durations) if durations else None,
        duration_max=max(durations) if durations else None, due=0)


def first_id_since(session: Session, moment: datetime) -> int:
    """The id of the first history line written at or after ``moment`` (one past the
    last line if none): a binary search on the primary key, as ids grow with time."""
    low, high = session.execute(select(func.min(HistoryLine.id),
                                       func.max(HistoryLine.id))).one()
    if low is None:
        return 1
    high += 1
    while low < high:
        middle = (low + high) // 2
        row = session.execute(select(HistoryLine.id, HistoryLine.created_at).where(
            HistoryLine.id >= middle).order_by(HistoryLine.id).limit(1)).first()
        if row is None or row.created_at >= moment:
            high = middle
        else:
            low = row.id + 1
    return low


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)
