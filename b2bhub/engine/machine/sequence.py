"""The transitions an operator starts, and sequences parked and released.

:func:`move` is an operator's guarded transition (to ``queued``, ``cancelled``,
``skipped``, as the action allows). A delivery that fails for good and blocks its
sequence has what follows it parked (``deferred``: :func:`park_behind` in the
transaction that failed it, :func:`park_blocked` as a sweep step for what arrives
later); :func:`release` queues them again once the blocker is skipped or resubmitted.
The queries are :mod:`b2bhub.engine.sequences`'; the writes are here.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session

from b2bhub.domain.states import DeliveryState
from b2bhub.engine import sequences, wakeups
from b2bhub.engine.history import add_line, add_lines
from b2bhub.engine.settings import DeliverySettings
from b2bhub.engine.status import refresh_statuses
from b2bhub.models import Delivery

S = DeliveryState


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
