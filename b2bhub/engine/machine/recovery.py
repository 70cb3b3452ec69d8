"""Recovery: deliveries in progress whose claimant is gone go back to the queue.

Sweep transitions (set-based, bounded, each on a (state, time) index): a lease that
expired (its claimant died or hung) and an owner process known dead put the delivery
back ``queued``, due now. A late outcome of the attempt is then refused as stale
(:mod:`.settlement`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.domain.states import DeliveryState
from b2bhub.engine import presence
from b2bhub.engine.history import add_lines
from b2bhub.engine.status import refresh_statuses
from b2bhub.models import Delivery

S = DeliveryState


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
