"""Claims: queued, retrying or stalled deliveries go ``in_progress`` under a lease.

A claim increments the attempt number and hands back the :class:`Claim`, the fence every
settlement of the attempt must present (:mod:`.settlement`). The claimer's turn and the
lane its live leases count in are :mod:`.lanes`'. :func:`settle_and_claim` is the
runner's hot path: one batch's settlements and the next batch's claim in one
transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import DateTime, bindparam, text, update
from sqlalchemy.orm import Session

from b2bhub.domain.states import DeliveryState
from b2bhub.engine.driver import DriverSQL
from b2bhub.engine.history import connection
from b2bhub.engine.history import log as history_log
from b2bhub.engine.machine.common import _is_postgres, _record
from b2bhub.engine.machine.lanes import (
    _LANE_CHARGE,
    _PG_TRY_SHARE_TARGET,
    _READ_TARGET,
    Turn,
    _turn,
    lock_target,
)
from b2bhub.engine.machine.sequence import park_behind
from b2bhub.engine.machine.settlement import Settling, _write_outcomes
from b2bhub.models import Alert, InstanceState

S = DeliveryState

#: A queued delivery is due at once: its ``due_at`` is only the clock of the process that
#: queued it (the intake's, an operator's, the sweep's). Another host's clock may lag
#: that one, so a claimer takes a queued delivery whose ``due_at`` is up to this much
#: ahead of its own clock; without it, a worker whose clock ran 10 minutes ahead made
#: every message it took in wait 10 minutes for the others. A retry's ``due_at`` is a
#: promise (not before then), so retrying and stalled ones wait for the claimer's clock.
QUEUED_SKEW = timedelta(minutes=15)


@dataclass(frozen=True)
class Claim:
    """A won claim: the fence every settlement of this attempt must present."""

    delivery_id: int
    message_id: int
    target: str
    attempt: int
    failures: int
    owner: str
    ordered: bool = False  # the target delivers its sequences in order (SPEC 7)
    #: the lane of the target's Max Concurrent Deliveries the claim counted in (see
    #: :func:`lock_target`); its settlement's claim takes the same lane first
    lane: int = field(default=0, compare=False)
    #: what the attempt reads of the message, when the claim statement returned it
    #: (PostgreSQL): its columns as ``message_reads.read_messages`` reads them, then the payload
    #: stages as [stage, digest, size] lists. Not part of the fence.
    message: tuple | None = field(default=None, compare=False, repr=False)


_ORDERED = """
  AND (d.sequence_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM deliveries e WHERE e.target = d.target
         AND e.sequence_key = d.sequence_key AND e.id < d.id
         AND e.state NOT IN ('delivered', 'skipped', 'cancelled')))"""

# The claim statements are templates of four pieces:
#
# {limit}: how many to claim. The live-lease count in it keeps Max Concurrent Deliveries
# across processes. On PostgreSQL it counts the live leases charged to the claimer's
# lane (:func:`lock_target`) against that lane's share of the maximum; the claimers of
# one lane take turns on its lock (taken by the statement before, so this statement's
# snapshot sees every claim committed before it). SQLite has one writer at a time: one
# lane, every live lease of the target. A settlement committing meanwhile can only make
# the count high, never low.
# {lane}: the claimed rows take the claimer's lane (PostgreSQL; the floor of
# bench/claim_settle.py leaves it out with the count).
# {ordered}: the sequence condition of an ordered target.
# {stalled}: an extra returned column saying whether the claimed row has a
# delivery_stalled alert to resolve, so that the alert UPDATE runs only then. PostgreSQL
# returns the state the row had when it was locked (the sweep raises the alert in the
# transaction that stalls the row); SQLite returns only new values, and with its one
# writer the open alert itself is looked up, exactly.

# SQLite has one writer at a time, and so one lane: the live leases of the target
_SQLITE_COUNT = """
        SELECT count(*) FROM deliveries x
         WHERE x.target = :target AND x.state = 'in_progress'"""
_PG_LIMIT = f"""GREATEST(0, LEAST(:n, :max_concurrent - ({_LANE_CHARGE})))"""
_SQLITE_LIMIT = f"""max(0, min(:n, :max_concurrent - ({_SQLITE_COUNT})))"""
_LANE = ", lane = :lane"
_PG_STALLED = """,
       u.id = ANY (ARRAY(SELECT c.id FROM c WHERE c.state = 'stalled'))"""
_SQLITE_STALLED = """, EXISTS (SELECT 1 FROM alerts a WHERE a.kind = 'delivery_stalled'
    AND a.subject = 'delivery:' || deliveries.id AND a.resolved_at IS NULL)"""

# The claimed rows are updated through the primary key, by the array of their ids: the
# planner cannot estimate the LIMIT expression, and once statistics exist a join of the
# claimed rows chose a hash of a sequential scan of all deliveries (2.5 ms per claim at
# 10,000 rows). ``id = ANY (ARRAY(...))`` leaves it the primary key alone.
_PG_CLAIM = """
WITH c AS MATERIALIZED (
  SELECT d.id, d.state FROM deliveries d
   WHERE d.target = :target AND d.state IN ('queued', 'retrying', 'stalled')
     AND d.due_at <= :queued_due AND (d.state = 'queued' OR d.due_at <= :now) {ordered}
   ORDER BY d.due_at, d.id
   FOR UPDATE SKIP LOCKED
   LIMIT {limit})
UPDATE deliveries AS u
   SET state = 'in_progress', attempt = u.attempt + 1, lease_owner = :owner,
       lease_until = :until, next_wake_at = NULL, wake_count = 0, updated_at = :now{lane}
 WHERE u.id = ANY (ARRAY(SELECT c.id FROM c))
RETURNING u.id, u.message_id, u.attempt, u.failures{stalled}"""

_SQLITE_CLAIM = """
UPDATE deliveries
   SET state = 'in_progress', attempt = attempt + 1, lease_owner = :owner,
       lease_until = :until, next_wake_at = NULL, wake_count = 0, updated_at = :now{lane}
 WHERE id IN (
   SELECT d.id FROM deliveries d
    WHERE d.target = :target AND d.state IN ('queued', 'retrying', 'stalled')
      AND d.due_at <= :queued_due AND (d.state = 'queued' OR d.due_at <= :now) {ordered}
    ORDER BY d.due_at, d.id
    LIMIT {limit})
RETURNING id, message_id, attempt, failures{stalled}"""

# On PostgreSQL the claim also returns what the batch's attempts read of each message
# (by primary key, its payload stages by the payloads' message_id index): no statement
# and no transaction of their own after the claim. LEFT JOIN: a claimed row is returned
# whatever it finds. The claimed rows come out of the UPDATE's CTE ``k``.
_PG_CLAIM_READING = """{claim}),
k AS ({update}
       AS stalled)
SELECT k.id, k.message_id, k.attempt, k.failures, k.stalled, m.id, m.source,
       m.from_party, m.to_party, m.direction, m.original_filename, m.external_id,
       m.correlation_id, m.sequence_key, m.created_at, m.trace_parent,
       (SELECT json_agg(json_build_array(p.stage, p.digest, p.size)) FROM payloads p
         WHERE p.message_id = m.id)
  FROM k LEFT JOIN messages m ON m.id = k.message_id"""


def _pg_claim_reading(limit: str, ordered: str) -> str:
    """The PostgreSQL claim of :data:`_PG_CLAIM`, returning the message too."""
    claim = _PG_CLAIM.format(limit=limit, ordered=ordered, stalled=_PG_STALLED, lane=_LANE)
    head, _, update = claim.partition("\nUPDATE deliveries AS u")
    return _PG_CLAIM_READING.format(claim=head.rstrip().removesuffix(")"),
                                    update="UPDATE deliveries AS u" + update)


def claim(session: Session, target: str, owner: str, now: datetime, limit: int,
          lease_seconds: int, turn: Turn | None = None) -> list[Claim]:
    """Claim up to ``limit`` due deliveries of ``target`` without passing its Max
    Concurrent Deliveries across all processes. Of any number of claimants exactly one
    wins each delivery; every claim increments the attempt number.

    ``turn`` is what :func:`lock_target` returned in this transaction (taken here when
    not given). A target disabled, stopped or probed offline (``online`` False,
    ``b2bhub.engine.probes``) gets no claim: its deliveries wait with their attempt
    number unchanged."""
    claims, lines = _take(session, target, owner, now, limit, lease_seconds, turn)
    _record(session, lines, now)
    return claims


def settle_and_claim(session: Session, settling: Settling, target: str, owner: str,
                     lease_seconds: int, batch_size: Callable[[Any], int]
                     ) -> tuple[list[bool], list[Claim] | None, Any]:
    """Settle the outcomes of one batch and claim the next batch of the target, in the
    caller's one transaction: one commit, one status derivation and one history INSERT
    for both. ``settling`` is the batch's outcomes as :func:`.settlement.plan` planned
    them before the caller's turn to write (no outcomes: claim only); the claim is made
    at its time. Each outcome is fenced and recorded exactly as by :func:`settle_many`,
    and the claim, made after the settlements, counts the live leases exactly as
    :func:`claim`, in the lane of the settled batch when it can.

    On PostgreSQL claimers of one lane of a target take turns on its lock, and whoever
    holds it holds it to its commit (see :func:`lock_target`). A worker that finds no
    lane with room free (or the instance row being written) does not wait here, with the
    message rows of its settlements locked: it records the settlements alone and returns
    ``None`` for the claims; the caller commits and then claims with :func:`lock_target`
    and :func:`claim` in a transaction of their own. So a turn covers only the claim and
    its bookkeeping, never another worker's settlements, and no worker waits for a lane
    while holding message rows (which, with messages delivered to several targets, could
    close a cycle of waits).

    ``batch_size(instance row)`` says how many to claim (0: none). Returns, per outcome,
    whether it was written; the new claims (None: claim separately, see above); the
    target row (None: no such target).
    """
    now, outcomes = settling.now, settling.planned
    written, lines, blockers = _write_outcomes(session, settling)
    if blockers:
        # park what follows a blocker before the claim below could take it (on a target
        # that is not ordered, only the parking holds back a business rule's sequence)
        _record(session, lines, now)
        park_behind(session, blockers, now, owner)
        lines, blockers = [], []
    if outcomes and _is_postgres(session):
        conn = connection(session)
        row = _PG_TRY_SHARE_TARGET.run(conn, {
            "name": target, "preferred": outcomes[0][0].lane}).one_or_none()
        turn = _turn(row)
        if row is None:  # the row is being written, or there is no such target
            row = conn.execute(_READ_TARGET, {"name": target}).one_or_none()
        if turn is None and row is not None:  # no lane free: settle alone
            _record(session, lines, now)
            park_behind(session, blockers, now, owner)
            return written, None, row
    else:
        turn = lock_target(session, target, owner)
    instance = turn.instance if turn is not None else None
    limit = batch_size(instance) if instance is not None else 0
    claims, claimed = (_take(session, target, owner, now, limit, lease_seconds, turn)
                       if limit > 0 else ([], []))
    _record(session, lines + claimed, now)
    park_behind(session, blockers, now, owner)
    return written, claims, instance


def _claimable(turn: Turn | None) -> bool:
    instance = turn.instance if turn is not None else None
    return not (instance is None or not instance.enabled or instance.online is False
                or instance.state == InstanceState.STOPPED
                or instance.blocked_by_delivery_id is not None)  # see engine.blocking


def _take(session: Session, target: str, owner: str, now: datetime, limit: int,
          lease_seconds: int, turn: Turn | None) -> tuple[list[Claim], list[dict]]:
    """The claim statement and its alerts; returns the claims and their history lines
    (which :func:`_record` writes with the derived statuses)."""
    if turn is None:
        turn = lock_target(session, target, owner)
    if not _claimable(turn):
        return [], []
    params = {"target": target, "now": now, "owner": owner, "n": limit,
              "until": now + timedelta(seconds=lease_seconds),
              "queued_due": now + QUEUED_SKEW, **turn.params}
    ordered = bool(turn.instance.ordered)
    statement = _claim_driver(_is_postgres(session), ordered)
    rows = statement.run(connection(session), params).all()
    claims = [Claim(r[0], r[1], target, r[2], r[3], owner, ordered, turn.lane,
                    tuple(r[5:]) if len(r) > 5 and r[5] is not None else None)
              for r in rows]
    stalled = [f"delivery:{c.delivery_id}" for c, r in zip(claims, rows, strict=True) if r[4]]
    if stalled and connection(session).execute(
            _RESOLVE_STALLED, {"subjects": stalled, "now": now}).rowcount:
        history_log.info("alert resolved: delivery_stalled %s (claimed again)", ", ".join(stalled))
    return claims, [
        {"message_id": c.message_id, "delivery_id": c.delivery_id,
         "type": "delivery_changed", "actor": c.owner,
         "text": f"{c.target}: attempt {c.attempt} started",
         "data": {"state": S.IN_PROGRESS, "attempt": c.attempt, "target": c.target}}
        for c in claims]


_CLAIM_ONE = """
UPDATE deliveries
   SET state = 'in_progress', attempt = attempt + 1, lease_owner = :owner,
       lease_until = :until, next_wake_at = NULL, wake_count = 0, updated_at = :now{lane}
 WHERE id = :id AND target = :target AND state IN ('queued', 'retrying', 'stalled')
   AND ({count}) < :max_concurrent {ordered}
RETURNING id, message_id, attempt, failures"""


def claim_delivery(session: Session, delivery_id: int, target: str, owner: str,
                   now: datetime, lease_seconds: int, turn: Turn | None = None
                   ) -> Claim | None:
    """Claim this one delivery now, whatever its ``due_at`` says (the HTTP receiver's
    synchronous mode attempts inside the request, 1 s apart, SPEC 9). The same rules as
    :func:`claim` otherwise: none for a target disabled, stopped, blocked or probed
    offline, none past its Max Concurrent Deliveries, none before an earlier delivery
    of its sequence on an ordered target, and none once another process took it."""
    if turn is None:
        turn = lock_target(session, target, owner)
    if not _claimable(turn):
        return None
    ordered = bool(turn.instance.ordered)
    row = _claim_one_driver(_is_postgres(session), ordered).run(connection(session), {
        "id": delivery_id, "target": target, "owner": owner, "now": now,
        "until": now + timedelta(seconds=lease_seconds), **turn.params}).one_or_none()
    if row is None:
        return None
    found = Claim(row[0], row[1], target, row[2], row[3], owner, ordered, turn.lane)
    _record(session, [{"message_id": found.message_id, "delivery_id": found.delivery_id,
                       "type": "delivery_changed", "actor": owner,
                       "text": f"{target}: attempt {found.attempt} started",
                       "data": {"state": S.IN_PROGRESS, "attempt": found.attempt,
                                "target": target}}], now)
    return found


@functools.cache
def _claim_one_driver(postgres: bool, ordered: bool) -> DriverSQL:
    """:data:`_CLAIM_ONE` for the backend and the target's order, built once (the
    synchronous intake claims one delivery per request)."""
    return DriverSQL(_CLAIM_ONE.format(
        ordered=_ORDERED.replace("d.", "deliveries.") if ordered else "",
        lane=_LANE if postgres else "",
        count=_LANE_CHARGE if postgres else _SQLITE_COUNT), ("now", "until"))


@functools.cache
def _claim_statement(postgres: bool, ordered: bool):
    """The claim as text with typed time parameters, built once: SQLite stores times as
    text, and only the column type writes them the way the stored ones are written (a
    raw datetime of a whole second would lose its ``.000000`` and compare as earlier)."""
    sql = _pg_claim_reading(_PG_LIMIT, _ORDERED if ordered else "") if postgres else \
        _SQLITE_CLAIM.format(limit=_SQLITE_LIMIT, ordered=_ORDERED if ordered else "",
                             stalled=_SQLITE_STALLED, lane="")
    return text(sql).bindparams(bindparam("now", type_=DateTime()),
                                bindparam("until", type_=DateTime()),
                                bindparam("queued_due", type_=DateTime()))


@functools.cache
def _claim_driver(postgres: bool, ordered: bool) -> DriverSQL:
    """:func:`_claim_statement` as the driver runs it (:mod:`.driver`)."""
    return DriverSQL(_claim_statement(postgres, ordered).text, _TIMES)


_TIMES = ("now", "until", "queued_due")
_RESOLVE_STALLED = (update(Alert.__table__)
                    .where(Alert.__table__.c.kind == "delivery_stalled",
                           Alert.__table__.c.subject.in_(bindparam("subjects",
                                                                   expanding=True)),
                           Alert.__table__.c.resolved_at.is_(None))
                    .values(resolved_at=bindparam("now")))
