"""A partner's scorecard (docs/scorecard.md): its figures over the last 7, 30 or 90
days, per direction, source and target, added up from stored daily figures.

Every day's figures are folded once, by the ``housekeeping`` task, into
``scorecard_days`` rows (:func:`roll_up`) when the day is :data:`SETTLE_DAYS` days
old: by then its deliveries have settled (a receipt waits 24 h at most by default),
and what has not yet counts as pending. The days after the last one folded (at most
three, plus today) are folded from the message and delivery rows when a scorecard is
asked for, found by the per-party indexes (``ix_messages_from_party_id``,
``ix_messages_to_party_id``) from the first message of the first such day. So a
scorecard reads at most 90 days of stored rows and a few days of messages, however
many messages the partner has: a million answer in the time bench/scorecard.py
measures. The arithmetic is :mod:`b2bhub.domain.scorecard`'s."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from itertools import chain

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.orm import Session

from b2bhub.domain import scorecard as rules
from b2bhub.domain.scorecard import Figures
from b2bhub.models import (
    PARTNER,
    AckWait,
    Delivery,
    HistoryLine,
    Message,
    Party,
    ScorecardDay,
    Setting,
)
from b2bhub.models.expected import LATE, MET, MISSED, ExpectedRule, ExpectedWindow
from b2bhub.services.config import no_party
from b2bhub.services.errors import NotFound

#: a day is folded into ``scorecard_days`` once it is this many days old
SETTLE_DAYS = 3
#: the days :func:`roll_up` folds at most per call (the housekeeping runs every minute)
DAYS_PER_CALL = 1
ROLLED_KEY = "scorecard_rolled_through"
#: the lines of a receipt that came after its delivery was failed for want of one
REFUSED_TYPES = ("mdn_refused", "receipt_refused")
DIRECTIONS = ("inbound", "outbound")

Key = tuple[str, str, str, str]  # partner, direction, source, target


@dataclass
class Row:
    direction: str
    source: str
    target: str
    figures: Figures


@dataclass
class Scorecard:
    partner: str
    days: int
    since: datetime
    until: datetime
    rows: list[Row]
    #: per direction, the rows added up (a message sent to two targets counts twice)
    totals: dict[str, Figures]
    #: the expected-message windows of the period that concern the partner, by state
    expected: dict[str, int]
    #: the last day read from ``scorecard_days``; the days after it were folded now
    stored_through: date | None = None
    live_since: datetime | None = None


def scorecard(session: Session, partner: str, days: int, now: datetime) -> Scorecard:
    """The partner's figures over today and the ``days - 1`` days before it (UTC)."""
    if not session.scalar(select(Party.id).where(Party.name == partner,
                                                 Party.kind == PARTNER)):
        raise NotFound(no_party(PARTNER, partner))
    since = _day(now) - timedelta(days=days - 1)
    rolled = rolled_through(session)
    found: dict[Key, Figures] = {}
    stored_through = None
    if rolled is not None and rolled >= since:
        stored_through = rolled.date()
        for row in session.execute(select(ScorecardDay).where(
                ScorecardDay.partner == partner, ScorecardDay.day >= since,
                ScorecardDay.day <= rolled)).scalars():
            _merge(found, (partner, row.direction, row.source, row.target),
                   Figures.of(row.figures))
    live_since = max(since, rolled + timedelta(days=1)) if rolled is not None else since
    for key, figures in _fold_partner(session, partner, live_since).items():
        _merge(found, key, figures)
    rows = [Row(k[1], k[2], k[3], f) for k, f in sorted(found.items())]
    totals = {d: Figures() for d in DIRECTIONS}
    for row in rows:
        totals[row.direction].add(row.figures)
    return Scorecard(partner, days, since, now, rows, totals,
                     expected_windows(session, partner, since, now), stored_through,
                     live_since)


def expected_windows(session: Session, partner: str, since: datetime,
                     until: datetime) -> dict[str, int]:
    """The expected-message windows that ended in the period and concern the partner,
    by state: met, missed and late (docs/expected-messages.md). A window concerns the
    partner when its rule names it as either party, or, for a relation's window, when
    the request it follows was between it and us (the window's own parties). Open
    windows are not counted: they are not judged yet. One grouped query on the
    ``(state, ends_at)`` index."""
    counts = {MET: 0, MISSED: 0, LATE: 0}
    rows = session.execute(
        select(ExpectedWindow.state, func.count()).join(
            ExpectedRule, ExpectedRule.id == ExpectedWindow.rule_id)
        .where(ExpectedWindow.state.in_(list(counts)),
               ExpectedWindow.ends_at >= since, ExpectedWindow.ends_at < until,
               or_(ExpectedRule.from_party == partner, ExpectedRule.to_party == partner,
                   ExpectedWindow.from_party == partner,
                   ExpectedWindow.to_party == partner))
        .group_by(ExpectedWindow.state))
    for state, count in rows:
        counts[state] = count
    return counts


# --- the daily fold -------------------------------------------------------------------

def roll_up(session: Session, now: datetime, limit: int = DAYS_PER_CALL) -> int:
    """Fold the next days old enough (:data:`SETTLE_DAYS`) into ``scorecard_days``,
    ``limit`` at most, each replacing what a day had; the caller commits. The first
    call starts at the first message, or 90 days back. Returns the days folded."""
    today = _day(now)
    rolled = rolled_through(session)
    if rolled is not None:
        day = rolled + timedelta(days=1)
    else:
        first = session.scalar(select(func.min(Message.created_at)))
        if first is None:
            return 0
        day = max(_day(first), today - timedelta(days=max(rules.PERIODS)))
    done = 0
    while done < limit and day + timedelta(days=SETTLE_DAYS) <= today:
        end = day + timedelta(days=1)
        session.execute(delete(ScorecardDay).where(ScorecardDay.day == day))
        where = (Message.created_at >= day, Message.created_at < end)
        # ids grow with time: the day's messages lie between the first one of the day
        # and the first one an hour after it (a message's time is taken as it is
        # written, moments before its id)
        first_id = _first_message_id(session, day)
        stop_id = _first_message_id(session, end + timedelta(hours=1))
        folded = _fold(session, _message_rows(session, where, first_id, stop_id),
                       _ack_rows(session, (AckWait.message_id >= first_id, *where)))
        session.add_all(ScorecardDay(partner=k[0], day=day, direction=k[1], source=k[2],
                                     target=k[3], figures=f.as_dict())
                        for k, f in folded.items())
        _set_rolled(session, day)
        session.flush()
        day, done = end, done + 1
    return done


def rolled_through(session: Session) -> datetime | None:
    value = session.scalar(select(Setting.value).where(Setting.key == ROLLED_KEY))
    return datetime.fromisoformat(value) if value else None


def _set_rolled(session: Session, day: datetime) -> None:
    row = session.get(Setting, ROLLED_KEY)
    if row is None:
        session.add(Setting(key=ROLLED_KEY, value=day.date().isoformat()))
    else:
        row.value = day.date().isoformat()


def _fold_partner(session: Session, partner: str, since: datetime) -> dict[Key, Figures]:
    first_id = _first_message_id(session, since)
    inbound = (Message.from_party == partner, Message.direction == "inbound",
               Message.id >= first_id, Message.created_at >= since)
    outbound = (Message.to_party == partner, Message.direction == "outbound",
                Message.id >= first_id, Message.created_at >= since)
    rows = chain(_message_rows(session, inbound, first_id),
                 _message_rows(session, outbound, first_id))
    return _fold(session, rows, _ack_rows(session, (
        AckWait.partner == partner, AckWait.message_id >= first_id)))


def _first_message_id(session: Session, moment: datetime) -> int:
    """The id of the first message created at or after ``moment`` (ids grow with time;
    ``ix_messages_created_at_id``); one past the last when there is none."""
    found = session.scalar(select(func.min(Message.id)).where(Message.created_at >= moment))
    if found is not None:
        return found
    return (session.scalar(select(func.max(Message.id))) or 0) + 1


def _message_rows(session: Session, where: Iterable, first_id: int,
                  stop_id: int | None = None) -> Iterable:
    """The rows of the messages ``where`` selects, each with one of its deliveries (or
    none), read a batch at a time (a busy day's rows are never all in memory). The
    deliveries are bounded to the messages' range of ids too: without it, PostgreSQL
    joined a few days' messages to every delivery of the table by a hash of all of them
    (a second for a million, bench/scorecard.py)."""
    m, d = Message.__table__.c, Delivery.__table__.c
    on = [d.message_id == m.id, d.message_id >= first_id, m.id >= first_id]
    if stop_id is not None:
        on += [d.message_id < stop_id]
        where = (*where, m.id < stop_id)
    return session.execute(
        select(m.id, m.direction, m.from_party, m.to_party, m.source,
               m.size, m.created_at, d.id.label("delivery_id"), d.target, d.state,
               d.failure_kind, d.attempt, d.settled_at, d.receipt_ref,
               func.substr(d.last_result, 1, len(rules.NO_RECEIPT)).label("result"))
        .select_from(Message.__table__.outerjoin(Delivery.__table__, and_(*on)))
        .where(m.direction.in_(DIRECTIONS), *where).order_by(m.id, d.id),
        execution_options={"yield_per": 2000})


def _ack_rows(session: Session, where: Iterable) -> list:
    return session.execute(
        select(AckWait.partner, Message.source, AckWait.state, AckWait.overdue)
        .join(Message, Message.id == AckWait.message_id).where(*where)).all()


def _fold(session: Session, rows: Iterable, acks: list) -> dict[Key, Figures]:
    """The figures of these message and delivery rows, and acknowledgment waits."""
    found: dict[Key, Figures] = {}
    counted: set[tuple[int, Key]] = set()
    missing: dict[int, tuple[Key, int]] = {}  # delivery id: its key and message
    for r in rows:
        partner = r.from_party if r.direction == "inbound" else r.to_party
        key = (partner, r.direction, r.source, r.target or "")
        figures = found.setdefault(key, Figures())
        if (r.id, key) not in counted:
            counted.add((r.id, key))
            figures.count_message(r.size)
        if r.delivery_id is None:
            continue
        seconds = ((r.settled_at - r.created_at).total_seconds()
                   if r.settled_at is not None else None)
        figures.count_delivery(rules.outcome(r.state, r.failure_kind, r.attempt), seconds)
        column = rules.receipt(r.state, r.receipt_ref, r.result or "", False)
        if column is not None:
            figures.receipts[column] += 1
        if column == rules.MISSING:
            missing[r.delivery_id] = (key, r.id)
    for delivery_id in _receipts_after(session, missing):
        receipts = found[missing[delivery_id][0]].receipts
        receipts[rules.MISSING] -= 1
        receipts[rules.LATE] += 1
    for a in acks:
        key = (a.partner, "outbound", a.source, "")
        found.setdefault(key, Figures()).acks[rules.acknowledgment(a.state, a.overdue)] += 1
    return found


def _receipts_after(session: Session, missing: dict[int, tuple[Key, int]]) -> set[int]:
    """Of the deliveries failed for want of a receipt, those a receipt then came for
    (refused, as the delivery had failed): their receipts were late, not missing."""
    if not missing:
        return set()
    messages = sorted({message_id for _key, message_id in missing.values()})
    found: set[int] = set()
    for start in range(0, len(messages), 500):
        found.update(session.scalars(select(HistoryLine.delivery_id).where(
            HistoryLine.message_id.in_(messages[start:start + 500]),
            HistoryLine.type.in_(REFUSED_TYPES))))
    return found & set(missing)


def _merge(found: dict[Key, Figures], key: Key, figures: Figures) -> None:
    if key in found:
        found[key].add(figures)
    else:
        found[key] = figures


def _day(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)

