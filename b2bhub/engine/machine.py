"""The delivery state machine: the one module that writes ``deliveries.state``.

Every transition is a conditional UPDATE inside the caller's transaction that also
writes its history line(s), re-derives the message status and raises or resolves
alerts; wake-ups are queued with :func:`b2bhub.engine.wakeups.after_commit` and go out
only after the commit. The caller commits: one transition (or one batch of the same
transition) is one transaction.

==================  =============================  =====================================
event               from                           to
==================  =============================  =====================================
claim               queued, retrying, stalled      in_progress (attempt += 1, lease)
delivered           in_progress                    delivered            (fenced)
retry / error       in_progress                    retrying (due_at) or failed (fenced)
await receipt       in_progress                    awaiting_receipt     (fenced)
failed / business   in_progress                    failed (technical / business; a
                                                   rule may block the instance)
interrupted         in_progress                    queued, or retrying after wire_started
lease expired       in_progress                    queued (sweep)
owner gone          in_progress                    queued (sweep, owner known dead)
receipt overdue     awaiting_receipt               failed (sweep)
stalled             queued, retrying               stalled (sweep, after N wake-ups)
receipt             awaiting_receipt               delivered, or failed (MDN or API)
operator action     as the action allows           queued, cancelled, skipped (:func:`move`)
parked              queued, retrying, stalled      deferred (behind a failed delivery)
released            deferred                       queued (its blocker skipped/resubmitted)
==================  =============================  =====================================

A failure that blocks its sequence parks the deliveries behind it in the same
transaction, whichever path failed it (an attempt, an overdue or negative receipt, the
API's receipt report). :mod:`.sequences` holds the queries; the writes are here.

Fencing: an outcome is written only while the delivery is still ``in_progress`` with the
attempt number and lease owner of the claim that produced it. A late outcome changes
nothing and leaves a ``stale_outcome_ignored`` line. An outcome that arrives after the
lease time but before anyone put the delivery back is accepted: the attempt really ended
that way, and refusing it would only send the message twice.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    DateTime,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from b2bhub.domain.outcome import Outcome, OutcomeKind
from b2bhub.domain.retry import RetryPolicy
from b2bhub.domain.states import LABELS, DeliveryState, FailureKind
from b2bhub.engine import blocking, presence, sequences, wakeups
from b2bhub.engine.driver import DriverSQL, int_array
from b2bhub.engine.history import add_line, add_lines, connection, raise_alert
from b2bhub.engine.history import log as history_log
from b2bhub.engine.settings import DeliverySettings, load_settings
from b2bhub.engine.status import refresh_statuses
from b2bhub.models import Alert, Delivery, InstanceState, PluginInstance

S = DeliveryState
DEFAULT_RECEIPT_TIMEOUT = timedelta(hours=24)
#: A queued delivery is due at once: its ``due_at`` is only the clock of the process that
#: queued it (the intake's, an operator's, the sweep's). Another host's clock may lag
#: that one, so a claimer takes a queued delivery whose ``due_at`` is up to this much
#: ahead of its own clock; without it, a worker whose clock ran 10 minutes ahead made
#: every message it took in wait 10 minutes for the others. A retry's ``due_at`` is a
#: promise (not before then), so retrying and stalled ones wait for the claimer's clock.
QUEUED_SKEW = timedelta(minutes=15)
#: Lanes of a target's Max Concurrent Deliveries (PostgreSQL, see :func:`lock_target`):
#: about this many live leases each (the largest claim batch of the bundled plugins),
#: and at most LANES_MAX of them
LANE_SIZE = 16
LANES_MAX = 8


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
    #: (PostgreSQL): its columns as ``runner._READ_INFOS`` reads them, then the payload
    #: stages as [stage, digest, size] lists. Not part of the fence.
    message: tuple | None = field(default=None, compare=False, repr=False)


# --- claim -------------------------------------------------------------------------

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

# The live leases the claimer's lane is charged with: its own, and what any other lane
# has beyond its share. A lane can only be beyond its share after the maximum (or the
# split) changed under live leases, and then only until they end: without the charge, a
# lane with room would claim its whole share while another is still over, and together
# they would pass the new maximum. Other lanes' claimers never put their lane beyond its
# share, and only settlements change a lane that is (it gets no claims), so a count of
# them taken in an older snapshot can only charge too much, never too little. One scan
# of the target's live leases, a count per lane (no sort).
_LANE_OF = "coalesce(x.lane, 0) % :lanes"


def _lane_charge_sql() -> str:
    share = "(:total / :lanes + CASE WHEN {k} < :total % :lanes THEN 1 ELSE 0 END)"
    beyond = " + ".join(
        f"CASE WHEN :lane <> {k} AND c.n{k} > {share.format(k=k)} "
        f"THEN c.n{k} - {share.format(k=k)} ELSE 0 END" for k in range(LANES_MAX))
    counts = ", ".join(f"count(*) FILTER (WHERE {_LANE_OF} = {k}) AS n{k}"
                       for k in range(LANES_MAX))
    return f"""
       SELECT c.own + {beyond}
         FROM (SELECT count(*) FILTER (WHERE {_LANE_OF} = :lane) AS own, {counts}
                 FROM deliveries x
                WHERE x.target = :target AND x.state = 'in_progress') AS c"""


_LANE_CHARGE = _lane_charge_sql()
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


_INSTANCE = PluginInstance.__table__
_READ_TARGET = select(_INSTANCE).where(_INSTANCE.c.name == bindparam("name"))

# Lanes (PostgreSQL). A target's Max Concurrent Deliveries is split into lanes of about
# LANE_SIZE (at most LANES_MAX; an ordered target has one): lane k of L may have
# max // L live leases, one more for k < max % L, so the lanes' shares add up to the
# maximum. A claimer takes one lane's transaction lock (an advisory lock keyed by the
# instance's id and the lane) and counts only that lane's live leases: claimers of one
# target claim side by side in different lanes instead of taking turns on its row, and
# in each lane the count is exact, because its claimers take turns on its lock and each
# counts in a snapshot taken after the lock (the claim statement's own).
#
# Every claimer also holds the instance row FOR SHARE: a writer of the row (a change of
# the maximum, of the order, a stop, a probe, a block) waits for the claims under way,
# and claimers wait for it (or, settling, skip it), so the lanes never change while
# anyone claims by them. A lease claimed in lane k of an earlier split counts, under
# the split of now, in lane k % L: each live lease counts in exactly one lane. Sharers
# do not wait for each other; only a claimer's own lane is a turn.

_LANES = (f"CASE WHEN plugin_instances.ordered THEN 1 ELSE greatest(1, least({LANES_MAX}, "
          f"plugin_instances.max_concurrent_deliveries / {LANE_SIZE})) END")
# The lane to take: the one ``:preferred`` first (where the claimer's settled batch just
# freed room), then the least busy; none without room left. Locks are tried in that
# order, stopping at the first taken (the volatile filter stays above the ordered
# subquery: it is not pushed into it).
_FREE_LANE = f"""(SELECT f.k FROM (
    SELECT g.k FROM generate_series(0, {_LANES} - 1) AS g(k)
      LEFT JOIN (SELECT mod(coalesce(x.lane, 0), {_LANES}) AS k, count(*) AS busy
                   FROM deliveries x
                  WHERE x.target = plugin_instances.name AND x.state = 'in_progress'
                  GROUP BY 1) AS b ON b.k = g.k
     WHERE coalesce(b.busy, 0) < plugin_instances.max_concurrent_deliveries / {_LANES}
           + CASE WHEN g.k < mod(plugin_instances.max_concurrent_deliveries, {_LANES})
                  THEN 1 ELSE 0 END
     ORDER BY g.k = :preferred DESC, coalesce(b.busy, 0), g.k
     OFFSET 0) AS f
  WHERE pg_try_advisory_xact_lock(plugin_instances.id, f.k)
  LIMIT 1)"""
_SHARE_TARGET = f"""
SELECT {", ".join(f"plugin_instances.{c.name}" for c in _INSTANCE.c)},
       {_LANES} AS lanes, {_FREE_LANE} AS lane
  FROM plugin_instances WHERE plugin_instances.name = :name
   FOR SHARE OF plugin_instances{{skip}}"""


def _share_target(skip: bool) -> DriverSQL:
    """Run by the driver, its row read by column name like the model (psycopg loads the
    instance's JSON, times and booleans as SQLAlchemy's own types do on it)."""
    return DriverSQL(_SHARE_TARGET.format(skip=" SKIP LOCKED" if skip else ""), named=True)


_PG_SHARE_TARGET = _share_target(skip=False)
_PG_TRY_SHARE_TARGET = _share_target(skip=True)
_PG_WAIT_LANE = text("SELECT pg_advisory_xact_lock(:id, :lane)")
_SQLITE_TARGET = select(_INSTANCE, literal_column("1").label("lanes"),
                        literal_column("0").label("lane")).where(
    _INSTANCE.c.name == bindparam("name"))


@dataclass(frozen=True)
class Turn:
    """A claimer's turn at a target: its instance row and the lane it holds."""

    instance: Any  # the instance row (a Core row, attribute access like the model)
    lanes: int
    lane: int

    @property
    def share(self) -> int:
        """The lane's share of the target's Max Concurrent Deliveries."""
        total = self.instance.max_concurrent_deliveries
        return total // self.lanes + (1 if self.lane < total % self.lanes else 0)

    @property
    def params(self) -> dict[str, int]:
        """The claim statements' parameters of the lane (see :data:`_LANE_CHARGE`)."""
        return {"max_concurrent": self.share, "lanes": self.lanes, "lane": self.lane,
                "total": self.instance.max_concurrent_deliveries}


def _turn(row) -> Turn | None:
    return None if row is None or row.lane is None else Turn(row, row.lanes, row.lane)


def lock_target(session: Session, target: str, owner: str = "",
                preferred: int | None = None) -> Turn | None:
    """The claimer's turn at ``target`` for this transaction (None: no such target).
    On PostgreSQL the instance row is held FOR SHARE and one lane's lock is taken: a
    free lane with room if there is one, else the claimer waits for the lane its
    ``owner`` name falls in. Pass it to :func:`claim` in the same transaction."""
    conn = connection(session)
    if not _is_postgres(session):
        row = conn.execute(_SQLITE_TARGET, {"name": target}).one_or_none()
        return None if row is None else Turn(row, 1, 0)
    row = _PG_SHARE_TARGET.run(conn, {
        "name": target, "preferred": -1 if preferred is None else preferred}).one_or_none()
    if row is None or row.lane is not None:
        return _turn(row)
    lane = zlib.crc32(owner.encode()) % row.lanes  # every lane taken or full: wait for one
    conn.execute(_PG_WAIT_LANE, {"id": row.id, "lane": lane})
    return Turn(row, row.lanes, lane)


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


def settle_and_claim(session: Session, outcomes: list[tuple[Claim, Outcome]],
                     policy: RetryPolicy | None, target: str, owner: str, now: datetime,
                     lease_seconds: int, batch_size: Callable[[Any], int]
                     ) -> tuple[list[bool], list[Claim] | None, Any]:
    """Settle the outcomes of one batch and claim the next batch of the target, in the
    caller's one transaction: one commit, one status derivation and one history INSERT
    for both. Each outcome is fenced and recorded exactly as by :func:`settle_many`,
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
    written, lines, blockers = _write_outcomes(session, outcomes, policy, now)
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


def _record(session: Session, lines: list[dict], now: datetime) -> None:
    """Derive and store the status of the messages these lines are about, and write the
    lines ahead of the status lines, in one INSERT."""
    if lines:
        refresh_statuses(session, [line["message_id"] for line in lines], now, lines=lines)


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


# --- settle ------------------------------------------------------------------------

def settle(session: Session, claim: Claim, outcome: Outcome, policy: RetryPolicy,
           now: datetime) -> bool:
    """Record the outcome of one attempt, fenced by its claim. False if it was stale."""
    return settle_many(session, [(claim, outcome)], policy, now)[0]


def settle_many(session: Session, outcomes: list[tuple[Claim, Outcome]],
                policy: RetryPolicy, now: datetime) -> list[bool]:
    """Record several outcomes in the caller's one transaction (group commit).

    Each is fenced by its own claim exactly as :func:`settle` does; the history lines of
    all of them go in one insert and the statuses of their messages are derived once.
    Returns, per outcome, whether it was written (False: stale, recorded as such).
    """
    written, lines, blockers = _write_outcomes(session, outcomes, policy, now)
    _record(session, lines, now)
    if blockers:
        park_behind(session, blockers, now, outcomes[0][0].owner)
    return written


def _write_outcomes(session: Session, outcomes: list[tuple[Claim, Outcome]],
                    policy: RetryPolicy | None, now: datetime
                    ) -> tuple[list[bool], list[dict], list[int]]:
    """The fenced writes of the outcomes; per outcome whether it was written, the
    history lines of those written (stale ones get their line here), and the deliveries
    failed for good that block their sequence (to park what follows them)."""
    planned = [(claim, outcome, *_settlement(claim, outcome, policy or RetryPolicy(), now))
               for claim, outcome in outcomes]
    together = _deliver_together(session, [p for p in planned
                                            if p[1].kind is OutcomeKind.DELIVERED], now)
    written, lines, blockers = [], [], []
    for claim, outcome, values, line in planned:
        ok = together[claim.delivery_id] if claim.delivery_id in together else \
            _fenced_update(session, claim, values)
        written.append(ok)
        if not ok:
            _record_stale(session, claim, outcome.kind.value, now)
            continue
        lines.append({"message_id": claim.message_id, "delivery_id": claim.delivery_id,
                      "type": "delivery_changed", "actor": claim.owner, "text": line,
                      "data": {"state": values["state"], "attempt": claim.attempt,
                               "target": claim.target, **_json_safe(outcome.data)}})
        if values["state"] == S.FAILED and (claim.ordered or outcome.block == "sequence"):
            blockers.append(claim.delivery_id)
        if values["state"] == S.FAILED and outcome.block == "instance":
            line = blocking.block(session, claim.target, claim.delivery_id, claim.message_id,
                                  outcome.rule or "", claim.owner, now)
            lines += [line] if line else []
    return written, lines, blockers


def _deliver_together(session: Session, planned: list, now: datetime) -> dict[int, bool]:
    """Write several delivered outcomes of one owner in one UPDATE, each row still fenced
    by its own attempt number; {delivery id: written}. Fewer than two: nothing done
    here (the caller writes them one by one)."""
    owners = {claim.owner for claim, *_ in planned}
    if len(planned) < 2 or len(owners) != 1:
        return {}
    conn = connection(session)
    postgres = conn.dialect.name == "postgresql"
    statement, params = delivered_driver(
        [(claim.delivery_id, claim.attempt, outcome.text) for claim, outcome, *_ in planned],
        owners.pop(), now, postgres)
    done = set(statement.run(conn, params).scalars())
    return {claim.delivery_id: claim.delivery_id in done for claim, *_ in planned}


def delivered_update(rows: list[tuple[int, int, str]], owner: str, now: datetime,
                     postgres: bool) -> tuple[Any, dict]:
    """The UPDATE that settles these (delivery id, attempt, result) rows as delivered,
    and its parameters: :func:`_delivered_statement`; on PostgreSQL
    :data:`_PG_DELIVERED`, whose text is the same for any batch."""
    _statement, params = delivered_driver(rows, owner, now, postgres)
    clause = _PG_DELIVERED if postgres else _delivered_statement(len(rows))
    return clause, params


def delivered_driver(rows: list[tuple[int, int, str]], owner: str, now: datetime,
                     postgres: bool) -> tuple[DriverSQL, dict]:
    """:func:`delivered_update` as the driver runs it (``statement.run(conn, params)``,
    :mod:`.driver`): the statement a drain sends."""
    if postgres:
        return _PG_DELIVERED_DRIVER, {"owner": owner, "now": now,
                                      "ids": int_array(r[0] for r in rows),
                                      "attempts": int_array(r[1] for r in rows),
                                      "results": [r[2] for r in rows]}
    params = {"owner": owner, "now": now}
    for index, (delivery_id, attempt, result) in enumerate(rows):
        params[f"i{index}"], params[f"a{index}"], params[f"r{index}"] = \
            delivery_id, attempt, result
    return _delivered_driver(len(rows)), params


# PostgreSQL: the batch as three arrays, so the text and its 5 parameters are the same
# for any batch (psycopg parses it once and the server prepares it; the CASE form has
# three parameters per row, past the 50 psycopg keeps parsed). The rows are found by
# ``id = ANY`` alone (the primary key; state through COALESCE, as below), each held to
# its own attempt by its position in the arrays.
_PG_DELIVERED = text("""UPDATE deliveries
   SET state = 'delivered', settled_at = :now, failure_kind = NULL, lease_owner = NULL,
       lease_until = NULL, updated_at = :now,
       last_result = (CAST(:results AS text[]))[
           array_position(CAST(:ids AS bigint[]), deliveries.id)]
 WHERE id = ANY (CAST(:ids AS bigint[])) AND lease_owner = :owner
   AND coalesce(state, '') = 'in_progress'
   AND attempt = (CAST(:attempts AS integer[]))[
           array_position(CAST(:ids AS bigint[]), deliveries.id)]
RETURNING id""").bindparams(bindparam("now", type_=DateTime()))
_PG_DELIVERED_DRIVER = DriverSQL(_PG_DELIVERED.text)


@functools.cache
def _delivered_driver(count: int) -> DriverSQL:
    return DriverSQL.sqlite_of(_delivered_statement(count), ("now",))


@functools.cache
def _delivered_statement(count: int):
    """The UPDATE of ``count`` delivered outcomes, built once per count (a claim batch
    has at most ``claim_batch_max``): ``attempt`` and ``last_result`` are matched to
    each row's id by CASE, so every row is held to its own attempt number."""
    t = Delivery.__table__
    ids = [bindparam(f"i{k}", type_=t.c.id.type) for k in range(count)]
    attempts = case(*((ids[k], bindparam(f"a{k}", type_=t.c.attempt.type))
                      for k in range(count)), value=t.c.id)
    results = case(*((ids[k], bindparam(f"r{k}", type_=t.c.last_result.type))
                     for k in range(count)), value=t.c.id)
    now = bindparam("now", type_=DateTime())
    # The rows are found by id alone: ``state`` is compared through COALESCE (it is
    # never NULL), which no index matches. Otherwise the planner may pick a state index
    # instead of the primary key, and with no statistics it did: a bitmap scan of every
    # entry 'in_progress' ever had in it (dead ones too, until a vacuum), 0.9 ms per
    # batch.
    return (update(t).where(t.c.id.in_(ids), t.c.lease_owner == bindparam("owner"),
                            func.coalesce(t.c.state, "") == S.IN_PROGRESS,
                            t.c.attempt == attempts)
            .values(state=S.DELIVERED, settled_at=now, failure_kind=None, lease_owner=None,
                    lease_until=None, updated_at=now, last_result=results)
            .returning(t.c.id))


def settled_state(claim: Claim, outcome: Outcome, policy: RetryPolicy, now: datetime) -> str:
    """The state :func:`settle_many` with these arguments writes, when not stale (pure)."""
    return _settlement(claim, outcome, policy, now)[0]["state"]


def _settlement(claim: Claim, outcome: Outcome, policy: RetryPolicy,
                now: datetime) -> tuple[dict, str]:
    """The new column values and the history text for an outcome (pure)."""
    head = f"{claim.target}: attempt {claim.attempt}"
    done = {"lease_owner": None, "lease_until": None, "updated_at": now,
            "last_result": outcome.text}
    kind = outcome.kind
    if kind is OutcomeKind.DELIVERED:
        return ({**done, "state": S.DELIVERED, "settled_at": now, "failure_kind": None},
                f"{head} delivered: {outcome.text}")
    if kind is OutcomeKind.AWAITING_RECEIPT:
        deadline = outcome.receipt_deadline or now + DEFAULT_RECEIPT_TIMEOUT
        return ({**done, "state": S.AWAITING_RECEIPT, "receipt_ref": outcome.receipt_ref,
                 "receipt_deadline": deadline},
                f"{head}: {outcome.text}; receipt due by {deadline:%Y-%m-%d %H:%M:%S} UTC")
    if kind is OutcomeKind.FAILED:
        return _failed(done, FailureKind.TECHNICAL, f"{head} failed: {outcome.text}")
    if kind is OutcomeKind.BUSINESS_ERROR:
        return _failed(done, FailureKind.BUSINESS,
                       f"{head} failed by business rule {outcome.rule}: {outcome.text}")
    return _retry_or_fail(claim, outcome, policy, now, done, head)


def _failed(done: dict, kind: FailureKind, line: str) -> tuple[dict, str]:
    return ({**done, "state": S.FAILED, "failure_kind": kind, "settled_at": done["updated_at"],
             "due_at": None, "next_wake_at": None}, line)


def _retry_or_fail(claim: Claim, outcome: Outcome, policy: RetryPolicy, now: datetime,
                   done: dict, head: str) -> tuple[dict, str]:
    failures = claim.failures + 1
    decision = policy.decide(outcome.error_class, failures, now)
    done = {**done, "failures": failures}
    if not decision.retry:
        return _failed(done, FailureKind.TECHNICAL,
                       f"{head} failed: {outcome.text} ({decision.reason})")
    at = _capped(outcome.retry_at, policy, now) or decision.at
    return ({**done, "state": S.RETRYING, "due_at": at, "next_wake_at": at, "wake_count": 0},
            f"{head} failed: {outcome.text}; retrying at {at:%Y-%m-%d %H:%M:%S} UTC")


def _capped(at: datetime | None, policy: RetryPolicy, now: datetime) -> datetime | None:
    """A retry time the target asked for (an HTTP Retry-After), no later than the
    policy's ``max_delay`` from now and no earlier than now."""
    if at is None:
        return None
    if policy.max_delay is not None:
        at = min(at, now + timedelta(seconds=policy.max_delay))
    return max(at, now)


def _fenced_update(session: Session, claim: Claim, values: dict) -> bool:
    """Write ``values`` only while the claim's attempt, owner and state still hold."""
    params = {"_id": claim.delivery_id, "_attempt": claim.attempt, "_owner": claim.owner,
              **values}
    result = connection(session).execute(_fenced_statement(tuple(sorted(values))), params)
    return result.rowcount == 1


@functools.cache
def _fenced_statement(columns: tuple[str, ...]):
    """The fenced UPDATE for one set of columns, built once: a Core statement on the
    connection costs a fraction of building one and running it through the ORM."""
    t = Delivery.__table__.c
    return (update(Delivery.__table__)
            .where(t.id == bindparam("_id"), t.attempt == bindparam("_attempt"),
                   t.lease_owner == bindparam("_owner"), t.state == S.IN_PROGRESS)
            .values({name: bindparam(name) for name in columns}))


def _record_stale(session: Session, claim: Claim, what: str, now: datetime) -> None:
    row = session.execute(select(Delivery.state, Delivery.attempt).where(
        Delivery.id == claim.delivery_id)).one_or_none()
    state, attempt = row if row else ("deleted", None)
    add_line(session, claim.message_id, "stale_outcome_ignored",
             f"{claim.target}: outcome '{what}' of attempt {claim.attempt} arrived after "
             f"the delivery moved on (now {LABELS.get(state, state)}, attempt {attempt}); "
             "ignored", actor=claim.owner, delivery_id=claim.delivery_id, now=now,
             data={"attempt": claim.attempt, "current_attempt": attempt, "outcome": what})


def interrupt(session: Session, claim: Claim, now: datetime, wire_started: bool,
              reason: str, policy: RetryPolicy | None = None) -> bool:
    """Put back an attempt a stop cut short: to the queue, or to Retrying when the
    partner may already have received it. Never Failed because of a stop."""
    if wire_started:
        at = now + timedelta(seconds=(policy or RetryPolicy()).delay(max(claim.failures, 1)))
        values = {"state": S.RETRYING, "due_at": at, "next_wake_at": at}
        line = f"{claim.target}: attempt {claim.attempt} interrupted: {reason}; retrying"
    else:
        values = {"state": S.QUEUED, "due_at": now, "next_wake_at": now}
        line = f"{claim.target}: attempt {claim.attempt} interrupted: {reason}"
    values.update(lease_owner=None, lease_until=None, wake_count=0, updated_at=now)
    if not _fenced_update(session, claim, values):
        _record_stale(session, claim, "interrupted", now)
        return False
    add_line(session, claim.message_id, "delivery_changed", line, actor=claim.owner,
             delivery_id=claim.delivery_id, now=now,
             data={"state": values["state"], "attempt": claim.attempt})
    refresh_statuses(session, [claim.message_id], now)
    return True


# --- sweep transitions (set-based, bounded, each on a (state, time) index) ------------

def expire_leases(session: Session, now: datetime, limit: int) -> int:
    """Put back deliveries whose claimant died or hung past its lease."""
    due = (select(Delivery.id).where(Delivery.state == S.IN_PROGRESS,
                                     Delivery.lease_until < now).limit(limit))
    return _put_back(session, [Delivery.id.in_(due.scalar_subquery()),
                               Delivery.lease_until < now], now, lambda r: "lease expired")


def put_back_from_dead_owners(session: Session, now: datetime, db_now: datetime,
                              limit: int) -> int:
    """Put back at once the deliveries whose owner process is known dead at the database
    time ``db_now`` (:func:`b2bhub.engine.presence.known_dead`), fenced like an expired
    lease: the UPDATE takes only rows still in progress under that owner, and a late
    outcome of the attempt is refused as stale. The lease bounds only owners alive but
    hung. Cost: the deliveries in progress (at most the targets' Max Concurrent
    Deliveries together) on a (state, ...) index, each owner by primary key."""
    dead = presence.known_dead(db_now)
    owners = dict(session.execute(select(Delivery.id, Delivery.lease_owner).where(
        Delivery.state == S.IN_PROGRESS, Delivery.lease_owner.in_(dead)).limit(limit)).all())
    if not owners:
        return 0
    return _put_back(session, [Delivery.id.in_(list(owners)), Delivery.lease_owner.in_(dead)],
                     now, lambda r: f"owner {owners[r.id]} gone")


def _put_back(session: Session, where: list, now: datetime, reason: Callable) -> int:
    """Put the deliveries in progress that match ``where`` back in the queue, due now,
    each with the line ``attempt N interrupted: <reason(row)>``."""
    rows = session.execute(update(Delivery).where(Delivery.state == S.IN_PROGRESS, *where)
                           .values(state=S.QUEUED, due_at=now, next_wake_at=now, wake_count=0,
                                   lease_owner=None, lease_until=None, updated_at=now)
                           .returning(Delivery.id, Delivery.message_id, Delivery.attempt,
                                      Delivery.target)
                           .execution_options(synchronize_session=False)).all()
    add_lines(session, [{"message_id": r.message_id, "delivery_id": r.id,
                         "type": "delivery_changed", "actor": "sweep",
                         "text": f"{r.target}: attempt {r.attempt} interrupted: {reason(r)}",
                         "data": {"state": S.QUEUED, "attempt": r.attempt}} for r in rows], now)
    refresh_statuses(session, [r.message_id for r in rows], now)
    return len(rows)


def fail_overdue_receipts(session: Session, now: datetime, limit: int) -> int:
    """Fail deliveries whose receipt did not come within the deadline."""
    due = (select(Delivery.id).where(Delivery.state == S.AWAITING_RECEIPT,
                                     Delivery.receipt_deadline < now).limit(limit))
    rows = session.execute(select(Delivery.id, Delivery.message_id, Delivery.target,
                                  Delivery.updated_at, Delivery.receipt_deadline)
                           .where(Delivery.id.in_(due.scalar_subquery()))).all()
    failed = []
    for r in rows:
        waited = _duration(r.receipt_deadline - r.updated_at)
        ok = session.execute(update(Delivery).where(
            Delivery.id == r.id, Delivery.state == S.AWAITING_RECEIPT,
        ).values(state=S.FAILED, failure_kind=FailureKind.TECHNICAL, settled_at=now,
                 updated_at=now, last_result=f"no receipt within {waited}")
            .execution_options(synchronize_session=False)).rowcount
        if ok:
            failed.append({"message_id": r.message_id, "delivery_id": r.id,
                           "type": "delivery_changed", "actor": "sweep",
                           "text": f"{r.target}: no receipt within {waited}",
                           "data": {"state": S.FAILED, "target": r.target}})
    add_lines(session, failed, now)
    refresh_statuses(session, [f["message_id"] for f in failed], now)
    ordered = set(sequences.ordered_targets(session)) if failed else set()
    park_behind(session, [f["delivery_id"] for f in failed
                                    if f["data"]["target"] in ordered], now, "sweep")
    return len(failed)


def stall_unclaimed(session: Session, now: datetime, settings: DeliverySettings,
                    limit: int) -> int:
    """Stall deliveries woken ``stall_after`` times without any claim; alert."""
    due = (select(Delivery.id).where(Delivery.state.in_([S.QUEUED, S.RETRYING]),
                                     Delivery.next_wake_at <= now,
                                     Delivery.wake_count >= settings.stall_after,
                                     _not_held_target(), *_not_waiting(session))
           .limit(limit))
    rows = session.execute(update(Delivery).where(
        Delivery.id.in_(due.scalar_subquery()),
        Delivery.state.in_([S.QUEUED, S.RETRYING]),
    ).values(state=S.STALLED, next_wake_at=None, updated_at=now)
        .returning(Delivery.id, Delivery.message_id, Delivery.target, Delivery.wake_count)
        .execution_options(synchronize_session=False)).all()
    add_lines(session, [{"message_id": r.message_id, "delivery_id": r.id,
                         "type": "delivery_changed", "actor": "sweep",
                         "text": f"{r.target}: stalled: woken {r.wake_count} times without "
                                 "a claim (target stopped, disabled or overloaded)",
                         "data": {"state": S.STALLED}} for r in rows], now)
    for r in rows:
        raise_alert(session, "delivery_stalled", f"delivery:{r.id}",
                    f"delivery {r.id} to {r.target} is stalled", r.message_id, now)
    refresh_statuses(session, [r.message_id for r in rows], now)
    return len(rows)


def _not_held_target():
    """The deliveries of a target that is stopped, probed offline or blocked by a
    business rule wait: no wake-ups, not stalled (an operator stopped it on purpose;
    nobody can deliver to a destination that is down; a blocked one waits until an
    operator acts). Its start, the probe that finds it online again, or its release
    wakes them."""
    return Delivery.target.not_in(select(PluginInstance.name).where(or_(
        PluginInstance.state == InstanceState.STOPPED, PluginInstance.online.is_(False),
        PluginInstance.blocked_by_delivery_id.is_not(None))))


def wake_due(session: Session, now: datetime, settings: DeliverySettings,
             limit: int) -> list[tuple[int, str]]:
    """Count a wake-up on every due, unclaimed delivery and schedule the next one.

    Returns the wake-ups to publish after commit: per target, one per batch it may
    claim at once (:func:`wakeups_per_target`; one per delivery is waste).
    """
    rows = session.execute(select(Delivery.id, Delivery.target, Delivery.wake_count)
                           .where(Delivery.state.in_([S.QUEUED, S.RETRYING]),
                                  Delivery.next_wake_at <= now,
                                  Delivery.wake_count < settings.stall_after,
                                  _not_held_target(), *_not_waiting(session))
                           .order_by(Delivery.next_wake_at).limit(limit)).all()
    if not rows:
        return []
    params = [{"_id": r.id, "_wc": r.wake_count + 1,
               "_next": now + timedelta(seconds=settings.wake_delay(r.wake_count + 1))}
              for r in rows]
    table = Delivery.__table__
    session.connection().execute(
        update(table).where(table.c.id == bindparam("_id"),
                            or_(table.c.state == S.QUEUED, table.c.state == S.RETRYING))
        .values(wake_count=bindparam("_wc"), next_wake_at=bindparam("_next")), params)
    return wakeups_per_target(session, [(r.id, r.target) for r in rows], settings)


def wake_target(session: Session, target: str, now: datetime) -> None:
    """Wake the target's due deliveries after the commit (an operator started or
    released it): per batch it may claim at once, as the sweep would."""
    due = session.execute(select(Delivery.id, Delivery.target).where(
        Delivery.target == target, Delivery.state.in_([S.QUEUED, S.RETRYING]),
        Delivery.due_at <= now).order_by(Delivery.due_at, Delivery.id).limit(1000)).all()
    wakeups.after_commit(session, wakeups_per_target(session,
                                                     [(r.id, r.target) for r in due]))


def wakeups_per_target(session: Session, due: Iterable[tuple[int, str]],
                       settings: DeliverySettings | None = None) -> list[tuple[int, str]]:
    """The wake-ups to publish for due (delivery id, target) pairs: per target, one per
    batch it may claim at once. A woken worker drains its target, claiming up to the
    plugin type's claim batch (at most ``claim_batch_max``) at a time, so more
    wake-ups than ``ceil(min(due, Max Concurrent Deliveries) / claim batch)`` find
    nothing left to claim."""
    by_target: dict[str, list[int]] = {}
    for delivery_id, target in due:
        by_target.setdefault(target, []).append(delivery_id)
    if not by_target:
        return []
    if all(len(ids) == 1 for ids in by_target.values()):
        return [(ids[0], target) for target, ids in by_target.items()]  # one each anyway
    rows = session.execute(select(PluginInstance.name, PluginInstance.type,
                                  PluginInstance.max_concurrent_deliveries)
                           .where(PluginInstance.name.in_(list(by_target)))).all()
    most = (settings or load_settings(session)).claim_batch_max
    slots = {name: (max(1, concurrent or 1),
                    max(1, min(wakeups.claim_batch(type_name), most)))
             for name, type_name, concurrent in rows}
    out = []
    for target, ids in by_target.items():
        concurrent, batch = slots.get(target, (1, 1))
        out += [(i, target) for i in ids[:-(-min(len(ids), concurrent) // batch)]]
    return out


# --- helpers --------------------------------------------------------------------------

def _not_waiting(session: Session) -> list:
    """Conditions leaving out deliveries that wait their turn in an ordered sequence:
    nobody failed to claim them, so they are neither woken nor stalled."""
    ordered = sequences.ordered_targets(session)
    return [~sequences.waiting_in_sequence(ordered)] if ordered else []


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _json_safe(data: dict) -> dict:
    return {k: v for k, v in data.items() if isinstance(v, str | int | float | bool | None)}



def settle_receipt(session: Session, delivery_id: int, ref: str | None, ok: bool, text: str,
                   now: datetime, actor: str = "", kind: str = "mdn") -> bool:
    """Settle a delivery awaiting this receipt: delivered when ``ok``, else failed.

    A second settlement, or one after the deadline failed the delivery, changes nothing:
    it is recorded as ``<kind>_refused`` (unattributable) and False is returned. ``kind``
    names the lines: ``mdn`` for AS2, ``receipt`` for one reported through the API."""
    row = session.execute(select(Delivery.message_id, Delivery.target, Delivery.state)
                          .where(Delivery.id == delivery_id)).first()
    if row is None:
        return False
    values = ({"state": S.DELIVERED, "failure_kind": None} if ok
              else {"state": S.FAILED, "failure_kind": FailureKind.TECHNICAL})
    done = session.execute(update(Delivery).where(
        Delivery.id == delivery_id, Delivery.state == S.AWAITING_RECEIPT,
        Delivery.receipt_ref == ref,
    ).values(**values, settled_at=now, updated_at=now, last_result=text,
             receipt_deadline=None)
        .execution_options(synchronize_session=False)).rowcount
    if not done:
        add_line(session, row.message_id, f"{kind}_refused",
                 f"{row.target}: receipt {ref} is unattributable: the delivery is "
                 f"{LABELS[row.state]}; {text}", actor=actor, delivery_id=delivery_id,
                 now=now)
        return False
    add_lines(session, [
        {"message_id": row.message_id, "delivery_id": delivery_id, "type": f"{kind}_received",
         "actor": actor, "text": f"{row.target}: {text}"},
        {"message_id": row.message_id, "delivery_id": delivery_id,
         "type": "delivery_changed", "actor": actor,
         "text": f"{row.target}: {LABELS[values['state']]}",
         "data": {"state": values["state"]}}], now)
    refresh_statuses(session, [row.message_id], now, actor=actor)
    if not ok:  # whichever path settled it (an MDN, the API): the same parking
        failed = session.get(Delivery, delivery_id, populate_existing=True)
        if sequences.blocks_sequence(session, failed):
            park_behind(session, [delivery_id], now, actor)
    return True


# --- transitions an operator starts, and sequences parked and released ------------------

def move(session: Session, delivery: Delivery, to: str, now: datetime, actor: str,
         text: str, **values) -> bool:
    """One guarded transition (an operator's action): changes the row only if it is
    still in the state read, with its history line. False: it changed meanwhile."""
    done = session.execute(update(Delivery).where(
        Delivery.id == delivery.id, Delivery.state == delivery.state,
    ).values(state=to, updated_at=now, **values)
        .execution_options(synchronize_session=False)).rowcount
    if done != 1:
        return False
    add_line(session, delivery.message_id, "delivery_changed", text, actor=actor,
             delivery_id=delivery.id, now=now, data={"state": to, "from": delivery.state})
    session.expire(delivery)
    return True


def park_behind(session: Session, blockers: list[int], now: datetime, actor: str) -> int:
    """Park the open, unclaimed deliveries that come after each failed ``blockers`` id
    in its sequence. Call in the transaction that failed them."""
    if not blockers:
        return 0
    heads = session.execute(select(Delivery.id, Delivery.target, Delivery.sequence_key)
                            .where(Delivery.id.in_(blockers), Delivery.state == S.FAILED,
                                   Delivery.sequence_key.is_not(None))).all()
    parked = 0
    for head in heads:
        parked += _park(session, and_(Delivery.target == head.target,
                                      Delivery.sequence_key == head.sequence_key,
                                      Delivery.id > head.id), now, actor,
                        f"parked behind delivery {head.id}, which failed")
    return parked


def park_blocked(session: Session, now: datetime, limit: int) -> int:
    """Sweep step: park deliveries of ordered targets that arrived behind a failure."""
    ordered = sequences.ordered_targets(session)
    if not ordered:
        return 0
    due = (select(Delivery.id).where(Delivery.target.in_(ordered),
                                     Delivery.state.in_(sequences.PARKABLE),
                                     sequences.blocked_by_failure())
           .limit(limit))
    return _park(session, Delivery.id.in_(due.scalar_subquery()), now, "sweep",
                 "parked: an earlier delivery of its sequence failed")


def _park(session: Session, where, now: datetime, actor: str, why: str) -> int:
    rows = session.execute(
        update(Delivery).where(where, Delivery.state.in_(sequences.PARKABLE))
        .values(state=S.DEFERRED, next_wake_at=None, wake_count=0, updated_at=now)
        .returning(Delivery.id, Delivery.message_id, Delivery.target)
        .execution_options(synchronize_session=False)).all()
    _record_sequence(session, rows, S.DEFERRED, now, actor, why)
    return len(rows)


def release(session: Session, delivery: Delivery, now: datetime, actor: str,
            settings: DeliverySettings) -> int:
    """Queue again, in order, the parked deliveries behind ``delivery`` up to the next
    failed one of the sequence (which still blocks what follows it)."""
    if delivery.sequence_key is None:
        return 0
    rows = session.execute(
        update(Delivery).where(Delivery.target == delivery.target,
                               Delivery.sequence_key == delivery.sequence_key,
                               Delivery.id > delivery.id, Delivery.state == S.DEFERRED,
                               ~sequences.other_failure_before(delivery.id))
        .values(state=S.QUEUED, due_at=now, wake_count=1, updated_at=now,
                next_wake_at=now + timedelta(seconds=settings.wake_delay(1)))
        .returning(Delivery.id, Delivery.message_id, Delivery.target)
        .execution_options(synchronize_session=False)).all()
    _record_sequence(session, rows, S.QUEUED, now, actor,
                     f"released: delivery {delivery.id} no longer blocks the sequence")
    wakeups.after_commit(session, [(r.id, r.target) for r in sorted(rows)[:1]])
    return len(rows)


def _record_sequence(session: Session, rows, state: str, now: datetime, actor: str,
                     why: str) -> None:
    if not rows:
        return
    add_lines(session, [{"message_id": r.message_id, "delivery_id": r.id,
                         "type": "delivery_changed", "actor": actor,
                         "text": f"{r.target}: {why}", "data": {"state": state}}
                        for r in rows], now)
    refresh_statuses(session, [r.message_id for r in rows], now, actor)
