"""Ordered sequences (SPEC 7): one delivery at a time per (target, sequence key).

On a target instance marked ``ordered`` the claim takes a delivery only when no earlier
delivery of its sequence is still open (:data:`b2bhub.engine.machine._ORDERED`), so
later deliveries wait in dispatch order. The rest lives here:

- A delivery that fails for good blocks its sequence: the later deliveries of the
  sequence are parked (``deferred``, no wake-ups) at once by the settlement, and the
  sweep parks any that arrive while the blocker is still failed.
- The operator Resubmits the blocker (a new attempt; the parked ones go back to the
  queue, where the ordered claim keeps them behind it; should it fail again they are
  parked again) or Skips it (it ends ``skipped`` and the parked ones are released).
  Redeliver of the blocker is a resubmit: a delivery is never parked behind itself.
- A waiting delivery is not "unclaimed": the sweep neither wakes nor stalls a delivery
  that waits behind an earlier open one of its sequence.
- A business-error outcome with ``block="sequence"`` parks the rest of its sequence even
  on a target that is not ordered; there, released deliveries go out together, since
  such a target never promised order. ``block="instance"`` is not built yet.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, exists, select, update
from sqlalchemy.orm import Session, aliased

from b2bhub.domain.states import DeliveryState
from b2bhub.engine.history import add_lines
from b2bhub.engine.settings import DeliverySettings
from b2bhub.engine.status import refresh_statuses
from b2bhub.engine.wakeups import after_commit
from b2bhub.models import Delivery, PluginInstance

S = DeliveryState
CLOSED = (S.DELIVERED, S.SKIPPED, S.CANCELLED)
PARKABLE = (S.QUEUED, S.RETRYING, S.STALLED)


def ordered_targets(session: Session) -> list[str]:
    return list(session.scalars(select(PluginInstance.name).where(PluginInstance.ordered)))


def waiting_in_sequence(ordered: list[str]):
    """A condition on ``Delivery``: it belongs to an ordered target and an earlier
    delivery of its sequence is still open, so it waits by design."""
    earlier = aliased(Delivery)
    return and_(Delivery.target.in_(ordered), Delivery.sequence_key.is_not(None),
                exists().where(earlier.target == Delivery.target,
                               earlier.sequence_key == Delivery.sequence_key,
                               earlier.id < Delivery.id, earlier.state.not_in(CLOSED)))


def _blocked_by_failure():
    """A condition on ``Delivery``: an earlier delivery of its sequence failed."""
    failed = aliased(Delivery)
    return exists().where(failed.target == Delivery.target,
                          failed.sequence_key == Delivery.sequence_key,
                          failed.id < Delivery.id, failed.state == S.FAILED)


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
    ordered = ordered_targets(session)
    if not ordered:
        return 0
    due = (select(Delivery.id).where(Delivery.target.in_(ordered),
                                     Delivery.state.in_(PARKABLE), _blocked_by_failure())
           .limit(limit))
    return _park(session, Delivery.id.in_(due.scalar_subquery()), now, "sweep",
                 "parked: an earlier delivery of its sequence failed")


def _park(session: Session, where, now: datetime, actor: str, why: str) -> int:
    rows = session.execute(
        update(Delivery).where(where, Delivery.state.in_(PARKABLE))
        .values(state=S.DEFERRED, next_wake_at=None, wake_count=0, updated_at=now)
        .returning(Delivery.id, Delivery.message_id, Delivery.target)
        .execution_options(synchronize_session=False)).all()
    _record(session, rows, S.DEFERRED, now, actor, why)
    return len(rows)


def parked_behind(session: Session, delivery: Delivery) -> int:
    """How many deliveries wait parked behind ``delivery`` in its sequence."""
    if delivery.sequence_key is None:
        return 0
    return session.scalar(select(Delivery.id).where(
        Delivery.target == delivery.target, Delivery.sequence_key == delivery.sequence_key,
        Delivery.id > delivery.id, Delivery.state == S.DEFERRED).limit(1)) is not None


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
                               ~_other_failure_before(delivery.id))
        .values(state=S.QUEUED, due_at=now, wake_count=1, updated_at=now,
                next_wake_at=now + timedelta(seconds=settings.wake_delay(1)))
        .returning(Delivery.id, Delivery.message_id, Delivery.target)
        .execution_options(synchronize_session=False)).all()
    _record(session, rows, S.QUEUED, now, actor,
            f"released: delivery {delivery.id} no longer blocks the sequence")
    after_commit(session, [(r.id, r.target) for r in sorted(rows)[:1]])
    return len(rows)


def _other_failure_before(head_id: int):
    failed = aliased(Delivery)
    return exists().where(failed.target == Delivery.target,
                          failed.sequence_key == Delivery.sequence_key,
                          failed.id > head_id, failed.id < Delivery.id,
                          failed.state == S.FAILED)


def _record(session: Session, rows, state: str, now: datetime, actor: str,
            why: str) -> None:
    if not rows:
        return
    add_lines(session, [{"message_id": r.message_id, "delivery_id": r.id,
                         "type": "delivery_changed", "actor": actor,
                         "text": f"{r.target}: {why}", "data": {"state": state}}
                        for r in rows], now)
    refresh_statuses(session, [r.message_id for r in rows], now, actor)
