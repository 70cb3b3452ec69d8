"""Settlement: the outcome of an attempt, fenced by its claim.

``in_progress`` goes to ``delivered``, ``retrying`` (or ``failed`` when the policy gives
up), ``awaiting_receipt`` or ``failed`` (technical, or by a business rule, which may
block the instance or park the rest of the sequence); an attempt a stop cut short goes
back to ``queued``, or to ``retrying`` once the wire was touched (:func:`interrupt`).
Every write holds only while the delivery is still ``in_progress`` under the claim's
attempt and owner; a late outcome is recorded as ``stale_outcome_ignored``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import DateTime, bindparam, case, func, select, text, update
from sqlalchemy.orm import Session

from b2bhub.domain.outcome import Outcome, OutcomeKind
from b2bhub.domain.retry import RetryPolicy
from b2bhub.domain.states import LABELS, DeliveryState, FailureKind
from b2bhub.engine import blocking
from b2bhub.engine.driver import DriverSQL, int_array
from b2bhub.engine.history import add_line, connection
from b2bhub.engine.machine.common import _is_postgres, _record
from b2bhub.engine.machine.sequence import park_behind
from b2bhub.engine.status import refresh_statuses
from b2bhub.models import Delivery

if TYPE_CHECKING:  # a claim only passes through here (claiming imports this module)
    from b2bhub.engine.machine.claiming import Claim

S = DeliveryState
DEFAULT_RECEIPT_TIMEOUT = timedelta(hours=24)


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
    written, lines, blockers = _write_outcomes(
        session, plan(outcomes, policy, now, _is_postgres(session)))
    _record(session, lines, now)
    if blockers:
        park_behind(session, blockers, now, outcomes[0][0].owner)
    return written


@dataclass(frozen=True)
class Settling:
    """Outcomes planned for their settlement at ``now``: the work that reads nothing
    from the database, done before the writer's turn. Per outcome (claim, outcome, new
    column values, history line); the delivered ones of one owner, two or more, as
    their one UPDATE and its parameters (``together``).

    On SQLite one process writes at a time and a worker's settlement and next claim
    are its turn (:func:`.claiming.settle_and_claim`, the runner's writer lock): what
    is planned here is done while another worker writes. For a batch of 16 delivered
    outcomes planning takes 41-58 us, of a turn of 1.2-1.6 ms (timed around the calls
    in a drain of 20,000 deliveries, one process). ``now`` is the time the settlement
    and the next claim write, taken before the turn: a wait for the turn makes it that
    much earlier than their commit (milliseconds, against a lease of minutes)."""

    planned: list[tuple[Claim, Outcome, dict, dict]]
    together: tuple[DriverSQL, dict] | None
    now: datetime


def plan(outcomes: list[tuple[Claim, Outcome]], policy: RetryPolicy | None,
         now: datetime, postgres: bool) -> Settling:
    """The settlement of these outcomes at ``now`` (pure; see :class:`Settling`)."""
    policy = policy or RetryPolicy()
    planned = []
    for claim, outcome in outcomes:
        values, text_ = _settlement(claim, outcome, policy, now)
        planned.append((claim, outcome, values, {
            "message_id": claim.message_id, "delivery_id": claim.delivery_id,
            "type": "delivery_changed", "actor": claim.owner, "text": text_,
            "data": {"state": values["state"], "attempt": claim.attempt,
                     "target": claim.target, **_json_safe(outcome.data)}}))
    delivered = [(claim, outcome) for claim, outcome in outcomes
                 if outcome.kind is OutcomeKind.DELIVERED]
    owners = {claim.owner for claim, _ in delivered}
    together = None
    if len(delivered) > 1 and len(owners) == 1:
        together = delivered_driver([(claim.delivery_id, claim.attempt, outcome.text)
                                     for claim, outcome in delivered],
                                    owners.pop(), now, postgres)
    return Settling(planned, together, now)


def _write_outcomes(session: Session, settling: Settling
                    ) -> tuple[list[bool], list[dict], list[int]]:
    """The fenced writes of the planned outcomes; per outcome whether it was written,
    the history lines of those written (stale ones get their line here), and the
    deliveries failed for good that block their sequence (to park what follows them).
    The delivered ones of one owner go in one UPDATE, each row still fenced by its own
    attempt number; the others one by one."""
    together = {}
    if settling.together is not None:
        statement, params = settling.together
        done = set(statement.run(connection(session), params).scalars())
        together = {claim.delivery_id: claim.delivery_id in done
                    for claim, outcome, *_ in settling.planned
                    if outcome.kind is OutcomeKind.DELIVERED}
    now = settling.now
    written, lines, blockers = [], [], []
    for claim, outcome, values, line in settling.planned:
        ok = together[claim.delivery_id] if claim.delivery_id in together else \
            _fenced_update(session, claim, values)
        written.append(ok)
        if not ok:
            _record_stale(session, claim, outcome.kind.value, now)
            continue
        lines.append(line)
        if values["state"] == S.FAILED and (claim.ordered or outcome.block == "sequence"):
            blockers.append(claim.delivery_id)
        if values["state"] == S.FAILED and outcome.block == "instance":
            blocked = blocking.block(session, claim.target, claim.delivery_id,
                                     claim.message_id, outcome.rule or "", claim.owner, now)
            lines += [blocked] if blocked else []
    return written, lines, blockers


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


def _json_safe(data: dict) -> dict:
    return {k: v for k, v in data.items() if isinstance(v, str | int | float | bool | None)}
