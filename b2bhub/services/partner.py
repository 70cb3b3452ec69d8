"""What an operator opens when a partner calls (``/ui/parties/<name>``): the party's
newest messages both ways, how its deliveries of the last day went, its last receipt,
its profiles' certificates and the open alerts that concern it.

Every query is bounded (LIMIT) and reads by an index: the newest messages by
(from_party, id) and (to_party, id); the last day as an id range found from
(created_at, id); receipts by the history's message_id; certificates by their profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from b2bhub.domain.states import DeliveryState
from b2bhub.models import (
    Alert,
    Certificate,
    Delivery,
    HistoryLine,
    Message,
    ProtocolProfile,
)
from b2bhub.services.profiles import CERTIFICATE_WARNING

RECENT = 25
#: the most deliveries the day's figures read (the newest); a busier day says so
DAY_LIMIT = 20_000
#: how many of the newest messages each way are searched for the last receipt
RECEIPT_SEARCH = 200
RECEIPT_TYPES = ("mdn_received", "receipt_received", "mdn_refused", "receipt_refused")
ALERT_LIMIT = 50


def recent_messages(session: Session, name: str, limit: int = RECENT) -> list[Message]:
    """The party's newest messages from it or to it, newest first."""
    found: dict[int, Message] = {}
    for column in (Message.from_party, Message.to_party):
        for message in session.scalars(select(Message).where(column == name)
                                       .order_by(Message.id.desc()).limit(limit)):
            found[message.id] = message
    return [found[i] for i in sorted(found, reverse=True)[:limit]]


@dataclass(frozen=True)
class DayFigures:
    delivered: int
    failed: int
    pending: int
    median_seconds: float | None
    p95_seconds: float | None
    capped: bool  # more than DAY_LIMIT deliveries: the figures are of the newest

    @property
    def success_rate(self) -> float | None:
        """Delivered of those settled (delivered or failed), None when none settled."""
        settled = self.delivered + self.failed
        return self.delivered / settled if settled else None


def day_figures(session: Session, name: str, now: datetime) -> DayFigures:
    """The deliveries of the party's messages created in the last 24 hours: how many
    were delivered, failed, are still on their way, and the median and 95th percentile
    of the time from a message's arrival to its delivery."""
    since = now - timedelta(days=1)
    # the day's lowest id, from the (created_at, id) index alone; the party's rows from
    # that id on are read by its (from_party, id) and (to_party, id) indexes
    first = session.scalar(select(func.min(Message.id)).where(Message.created_at >= since))
    rows = [] if first is None else session.execute(
        select(Delivery.state, Delivery.settled_at, Message.created_at)
        .join(Message, Delivery.message_id == Message.id)
        .where(or_(Message.from_party == name, Message.to_party == name),
               Message.id >= first, Message.created_at >= since)
        .order_by(Message.id.desc()).limit(DAY_LIMIT + 1)).all()
    capped = len(rows) > DAY_LIMIT
    rows = rows[:DAY_LIMIT]
    latencies = sorted((settled - created).total_seconds() for state, settled, created in rows
                       if state == DeliveryState.DELIVERED and settled is not None)
    failed = sum(1 for row in rows if row.state == DeliveryState.FAILED)
    return DayFigures(len(latencies), failed, len(rows) - len(latencies) - failed,
                      _rank(latencies, 0.5), _rank(latencies, 0.95), capped)


def _rank(ordered: list[float], share: float) -> float | None:
    """The nearest-rank percentile of an ordered list (None when empty)."""
    if not ordered:
        return None
    return ordered[max(math.ceil(share * len(ordered)) - 1, 0)]


def newest_ids(session: Session, name: str, limit: int = RECEIPT_SEARCH) -> list[int]:
    """The ids of the party's newest ``limit`` messages each way."""
    return [i for column in (Message.from_party, Message.to_party)
            for i in session.scalars(select(Message.id).where(column == name)
                                     .order_by(Message.id.desc()).limit(limit))]


def last_receipt(session: Session, ids: list[int]) -> HistoryLine | None:
    """The newest receipt line (an AS2 MDN, or one reported through the API), received
    or refused, of the messages ``ids`` (:func:`newest_ids`)."""
    if not ids:
        return None
    return session.scalar(select(HistoryLine).where(
        HistoryLine.message_id.in_(ids), HistoryLine.type.in_(RECEIPT_TYPES))
        .order_by(HistoryLine.id.desc()).limit(1))


@dataclass(frozen=True)
class PartyCertificate:
    kind: str
    usage: str
    subject: str
    issuer: str
    not_after: datetime | None
    days_left: int | None
    ending: bool  # ended, or ends within 30 days


def certificates(session: Session, party_id: int, now: datetime) -> list[PartyCertificate]:
    """Every certificate of the party's profiles, soonest ending first."""
    rows = session.execute(
        select(ProtocolProfile.protocol, Certificate.usage, Certificate.subject,
               Certificate.issuer, Certificate.not_after)
        .join(ProtocolProfile, Certificate.profile_id == ProtocolProfile.id)
        .where(ProtocolProfile.party_id == party_id)
        .order_by(Certificate.not_after, Certificate.id).limit(100)).all()
    return [PartyCertificate(
        *row, days_left=None if row.not_after is None else (row.not_after - now).days,
        ending=row.not_after is not None and row.not_after <= now + CERTIFICATE_WARNING)
        for row in rows]


#: alerts about a party that name it at the start of their subject, not on a message:
#: a certificate of one of its profiles ending
SUBJECT_PREFIXES = {"certificate_expiring": "certificate:{name}:"}


def open_alerts(session: Session, name: str, ids: list[int]) -> list[Alert]:
    """Open alerts about the party: on its messages ``ids`` (failed, not routed,
    stalled; a receipt from it that matched no message is kept as a message of its own
    and alerted on that), and those whose subject names it (by the alerts' (kind,
    subject) index)."""
    found = {a.id: a for a in session.scalars(select(Alert).where(
        Alert.message_id.in_(ids), Alert.resolved_at.is_(None)).limit(ALERT_LIMIT))} \
        if ids else {}
    for kind, prefix in SUBJECT_PREFIXES.items():
        found.update((a.id, a) for a in session.scalars(select(Alert).where(
            Alert.kind == kind, Alert.subject.startswith(prefix.format(name=name),
                                                         autoescape=True),
            Alert.resolved_at.is_(None)).limit(ALERT_LIMIT)))
    return [found[i] for i in sorted(found, reverse=True)[:ALERT_LIMIT]]
