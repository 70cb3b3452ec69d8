"""Ordered sequences (SPEC 7): one delivery at a time per (target, sequence key).

On a target instance marked ``ordered`` the claim takes a delivery only when no earlier
delivery of its sequence is still open (:data:`b2bhub.engine.machine.claiming._ORDERED`), so
later deliveries wait in dispatch order. The rest lives here:

The queries are here; the writes (parking, releasing) are transitions of the state
machine (:mod:`b2bhub.engine.machine.sequence`; the package
:mod:`b2bhub.engine.machine` alone writes ``deliveries.state``).

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

from sqlalchemy import and_, exists, select
from sqlalchemy.orm import Session, aliased

from b2bhub.domain.states import DeliveryState
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


def blocked_by_failure():
    """A condition on ``Delivery``: an earlier delivery of its sequence failed."""
    failed = aliased(Delivery)
    return exists().where(failed.target == Delivery.target,
                          failed.sequence_key == Delivery.sequence_key,
                          failed.id < Delivery.id, failed.state == S.FAILED)


def parked_behind(session: Session, delivery: Delivery) -> int:
    """How many deliveries wait parked behind ``delivery`` in its sequence."""
    if delivery.sequence_key is None:
        return 0
    return session.scalar(select(Delivery.id).where(
        Delivery.target == delivery.target, Delivery.sequence_key == delivery.sequence_key,
        Delivery.id > delivery.id, Delivery.state == S.DEFERRED).limit(1)) is not None


def other_failure_before(head_id: int):
    failed = aliased(Delivery)
    return exists().where(failed.target == Delivery.target,
                          failed.sequence_key == Delivery.sequence_key,
                          failed.id > head_id, failed.id < Delivery.id,
                          failed.state == S.FAILED)


def blocks_sequence(session: Session, delivery: Delivery) -> bool:
    """Whether a failure of ``delivery`` blocks its sequence: its target is ordered, or
    deliveries wait parked behind it already (a business rule blocked it)."""
    ordered = session.scalar(select(PluginInstance.ordered).where(
        PluginInstance.name == delivery.target))
    return bool(ordered) or parked_behind(session, delivery) > 0
