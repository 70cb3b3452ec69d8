"""Functional acknowledgments of received interchanges (docs/edi.md): an X12 997 or
999, an EDIFACT CONTRL, made by a worker for each interchange a partner that wants
them sends one of our organizations, and dispatched by the routes as a message from
us to the partner.

Every long wait is a row with a due time: the intake's inspection writes an
``edi_ack_jobs`` row with each message whose envelope can be acknowledged
(:func:`job_rows`, in the same statement as the message, stored or refused). A worker,
woken by beat:

1. drops in one statement the jobs no acknowledgment is due for (the sender is no
   partner wanting them, or the receiver is none of our organizations);
2. claims due jobs with one UPDATE that only one worker wins (``claimed_by`` its token,
   ``due_at`` a lease ahead: a worker killed mid-way leaves them to be taken again);
3. per job, re-reads the envelope from the stored ``unpacked`` stage (no lock held),
   then in ONE transaction deletes the job fenced by its token, takes our next control
   number for the partner and standard (:func:`next_number`, a row lock held to the
   commit), stores the acknowledgment as a new message, dispatches it and writes the
   received message's ``ack_generated`` line. Nothing is lost, nothing done twice.

A job that fails (a payload gone, a broken inspector) is tried again later
(:data:`RETRY_DELAYS`), at most :data:`MAX_ATTEMPTS` times, then given up with an
``ack_failed`` line.
"""

from __future__ import annotations

import io
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, delete, exists, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from b2bhub.engine.ack_waits import ack_due
from b2bhub.engine.dispatch import NewMessage, store_and_dispatch_many
from b2bhub.engine.history import add_line
from b2bhub.engine.inspection import attributes, inspect_with
from b2bhub.engine.writelock import serialized_writes
from b2bhub.models import (
    ORGANIZATION,
    PARTNER,
    AckJob,
    AckNumber,
    Message,
    MessageAttribute,
    Party,
    Payload,
)
from b2bhub.plugin import AckRequest

log = logging.getLogger(__name__)
#: the standards acknowledged, and the document types of acknowledgments (an
#: interchange holding only those is never acknowledged: no ack of an ack)
STANDARDS = ("X12", "EDIFACT")
ACK_TYPES = frozenset({"997", "999", "TA1"})
ACK_PREFIXES = ("CONTRL",)
LEASE = timedelta(minutes=2)
RETRY_DELAYS = (30, 120, 600, 1800, 3600)
MAX_ATTEMPTS = 8
#: our control numbers run 1 ... MOST_NUMBER (X12's ISA13 has nine digits), then 1 again
MOST_NUMBER = 999_999_999
#: jobs taken per claim (each is a transaction of its own; small, so that workers share)
CLAIM = 10


def job_rows(pairs: list[tuple[str, str]]) -> list[tuple]:
    """The ``edi_ack_jobs`` row of a message whose inspection found ``pairs``
    (:func:`b2bhub.engine.inspection.attributes`), [] when its envelope is nothing to
    acknowledge: no X12 or EDIFACT interchange, no sender or receiver read, no set,
    or acknowledgments only. Whether its partner wants one is asked by the worker."""
    found = dict(pairs)
    types = [v for n, v in pairs if n == "document_type"]
    if found.get("standard") not in STANDARDS or not (
            found.get("sender") and found.get("receiver")) or not types:
        return []
    if all(t in ACK_TYPES or t.startswith(ACK_PREFIXES) for t in types):
        return []
    return [(AckJob.__table__, {})]


@dataclass
class AckReport:
    dropped: int = 0
    made: int = 0
    failed: int = 0
    more_due: bool = False


def run_due_acks(session: Session, store, now: datetime, owner: str,
                 batches: int = 20) -> AckReport:
    """Make the due acknowledgments, at most ``batches`` claims of :data:`CLAIM`;
    ``more_due`` when some were left for another run."""
    report = AckReport()
    if session.scalar(select(AckJob.message_id).limit(1)) is None:
        session.rollback()
        return report  # an idle tick is one read
    with serialized_writes(session):
        report.dropped = drop_unwanted(session)
        session.commit()
    for _ in range(batches):
        token, ids = claim(session, now, owner)
        for message_id in ids:
            try:
                made = make_ack(session, store, message_id, token, now)
                report.made += made
            except Exception as exc:  # noqa: BLE001 - any failure: the row tries again
                session.rollback()
                log.warning("acknowledgment of message %s failed", message_id, exc_info=True)
                retry_later(session, message_id, token, now, f"{type(exc).__name__}: {exc}")
                report.failed += 1
        if len(ids) < CLAIM:
            return report
    report.more_due = True
    return report


def drop_unwanted(session: Session) -> int:
    """Delete the unclaimed jobs no acknowledgment is due for, in one statement."""
    sender, receiver = aliased(Party), aliased(Party)
    wanted = exists(select(1).select_from(Message)
                    .join(sender, sender.name == Message.from_party)
                    .join(receiver, receiver.name == Message.to_party)
                    .where(Message.id == AckJob.message_id, sender.kind == PARTNER,
                           sender.functional_acks != "none",
                           receiver.kind == ORGANIZATION))
    return session.execute(delete(AckJob).where(AckJob.claimed_by.is_(None), ~wanted)
                           .execution_options(synchronize_session=False)).rowcount


def claim(session: Session, now: datetime, owner: str, limit: int = CLAIM
          ) -> tuple[str, list[int]]:
    """Take up to ``limit`` due jobs for this worker: one UPDATE, which only one worker
    wins for each row (PostgreSQL skips rows another claim holds); their message ids."""
    token = f"{owner}:{secrets.token_hex(4)}"[-80:]
    due = (select(AckJob.message_id)
           .where(or_(AckJob.due_at.is_(None), AckJob.due_at <= now))
           .order_by(AckJob.message_id).limit(limit))
    if session.get_bind().dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    with serialized_writes(session):
        ids = list(session.scalars(
            update(AckJob).where(AckJob.message_id.in_(due.scalar_subquery()),
                                 or_(AckJob.due_at.is_(None), AckJob.due_at <= now))
            .values(due_at=now + LEASE, claimed_by=token).returning(AckJob.message_id)
            .execution_options(synchronize_session=False)))
        session.commit()
    return token, sorted(ids)


def next_number(session: Session, party_id: int, standard: str) -> int:
    """Our next control number for acknowledgments to this party in this standard, in
    the caller's transaction: one statement that makes or bumps the counter's row and
    holds its lock to the commit, so concurrent workers get distinct numbers and a
    rolled back one is given again (it never went out)."""
    table = AckNumber.__table__
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(table).values(party_id=party_id, standard=standard, last_number=1)
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.c.party_id, table.c.standard],
        set_={"last_number": case((table.c.last_number >= MOST_NUMBER, 1),
                                  else_=table.c.last_number + 1)})
    return session.scalar(stmt.returning(table.c.last_number))


def _fenced_delete(session: Session, message_id: int, token: str) -> bool:
    return session.execute(delete(AckJob).where(
        AckJob.message_id == message_id, AckJob.claimed_by == token)
        .execution_options(synchronize_session=False)).rowcount == 1


@dataclass(frozen=True)
class _Received:
    """What a job needs of its message and parties, read before the work."""

    id: int
    source: str
    from_party: str
    to_party: str
    correlation_id: str | None
    partner_id: int
    kind: str  # the partner's functional_acks
    ours: tuple[str, ...]  # our organization's EDI identities
    digest: str | None


def _read(session: Session, message_id: int) -> _Received | None:
    """The job's message and parties; None when no acknowledgment is due for it."""
    message = session.get(Message, message_id)
    if message is None:
        return None
    parties = {p.name: p for p in session.scalars(select(Party).where(
        Party.name.in_([message.from_party, message.to_party])))}
    partner, org = parties.get(message.from_party), parties.get(message.to_party)
    if partner is None or org is None or not ack_due(partner.kind, partner.functional_acks,
                                                     org.kind):
        return None
    return _Received(message.id, message.source, message.from_party, message.to_party,
                     message.correlation_id, partner.id, partner.functional_acks,
                     tuple(org.edi_identities), session.scalar(select(Payload.digest).where(
                         Payload.message_id == message_id, Payload.stage == "unpacked")))


def make_ack(session: Session, store, message_id: int, token: str, now: datetime) -> int:
    """Make the acknowledgment of one claimed job; 1 if one was made, else 0."""
    received = _read(session, message_id)
    session.rollback()  # the reading is done; no lock is held while the stage is read
    if received is None:
        with serialized_writes(session):
            _fenced_delete(session, message_id, token)
            session.commit()
        return 0
    if received.digest is None:
        return _give_up(session, message_id, token, now, "it has no unpacked stage")
    with store.open(received.digest) as stream:
        found = inspect_with(stream)
    acknowledge = getattr(found[0], "acknowledge", None) if found else None
    if found is None or acknowledge is None:
        return _give_up(session, message_id, token, now,
                        "no inspector acknowledges its document")
    env = found[1]
    ours = received.ours
    sender = env.receiver if env.receiver in ours or not ours else ours[0]
    with serialized_writes(session):
        if not _fenced_delete(session, message_id, token):
            session.rollback()  # another worker took it after our lease ran out
            return 0
        number = next_number(session, received.partner_id, env.standard)
        ack = acknowledge(env, AckRequest(received.kind, number, sender, env.sender, now))
        if ack is not None:
            ack_id = _store_ack(session, store, received, ack, number, now)
            text = f"{ack.document_type} sent as message {ack_id}: {ack.outcome}"
            add_line(session, message_id, "ack_generated",
                     text + (f": {ack.detail}" if ack.detail else ""),
                     data={"ack_message_id": ack_id, "document_type": ack.document_type,
                           "control": number, "outcome": ack.outcome}, now=now)
            session.commit()
            return 1
        session.rollback()
    return _give_up(session, message_id, token, now,
                    "its envelope holds nothing to acknowledge")


def _store_ack(session: Session, store, received: _Received, ack, number: int,
               now: datetime) -> int:
    """The acknowledgment as a message from us to the partner, dispatched by the
    routes (its envelope's attributes stored with it); its id."""
    stored = store.put(ack.payload)
    found = inspect_with(io.BytesIO(ack.payload))
    table = MessageAttribute.__table__
    rows = [(table, {"name": name, "value": value})
            for name, value in (attributes(found[1]) if found else [])]
    new = NewMessage(
        source=received.source, from_party=received.to_party,
        to_party=received.from_party, stages={"unpacked": (stored.digest, stored.size)},
        direction="outbound", rows=rows, correlation_id=received.correlation_id,
        original_filename=f"{ack.document_type.lower()}-{number:09d}.edi",
        lines=[{"type": "ack_generated", "text": f"{ack.document_type} {ack.outcome} "
                f"of message {received.id}", "data": {"acknowledges": received.id}}])
    [ack_id] = store_and_dispatch_many(session, [new], now)
    return ack_id


def retry_later(session: Session, message_id: int, token: str, now: datetime,
                problem: str) -> None:
    """A job that failed: due again after a delay, or given up after
    :data:`MAX_ATTEMPTS`; fenced by the claim's token."""
    with serialized_writes(session):
        job = session.scalar(select(AckJob).where(
            AckJob.message_id == message_id, AckJob.claimed_by == token))
        if job is None:
            session.rollback()
            return
        last = job.attempts + 1 >= MAX_ATTEMPTS
        if not last:
            delay = RETRY_DELAYS[min(job.attempts, len(RETRY_DELAYS) - 1)]
            job.attempts += 1
            job.due_at, job.claimed_by, job.last_error = (
                now + timedelta(seconds=delay), None, problem[:500])
        session.commit()
    if last:
        _give_up(session, message_id, token, now,
                 f"it failed {MAX_ATTEMPTS} times; last: {problem}")


def _give_up(session: Session, message_id: int, token: str, now: datetime,
             why: str) -> int:
    """No acknowledgment can be made: the job goes, the message's history says why."""
    with serialized_writes(session):
        if _fenced_delete(session, message_id, token):
            add_line(session, message_id, "ack_failed",
                     f"no functional acknowledgment: {why}", now=now)
        session.commit()
    return 0
