"""A target instance blocked by a business error (SPEC 7 and 10, seed 003: a rule may
"block the Interface, holding back further messages until someone intervenes").

When a business-error rule with ``block: "instance"`` fails a delivery, the settlement
(:mod:`b2bhub.engine.machine.settlement`) calls :func:`block` in its own transaction: the instance
row names that delivery in ``blocked_by_delivery_id``. From then on:

- the claim takes nothing for the instance, so every further delivery waits where it
  is (queued or retrying), in its order, without using up an attempt;
- the sweep neither wakes nor stalls those deliveries: nobody failed to claim them;
- the instance shows Blocked, with the blocking delivery, on the dashboard, the Plugins
  list, System > Services, in the API's instance shape (``blocked_by``) and in
  ``GET /api/v1/stats``.

The operator releases the instance by acting on the blocking delivery: Resubmit (or
Redeliver, which is the same for it) queues it again ahead of the ones that waited, and
Skip ends it Skipped. Either calls :func:`release` in the action's transaction, which
writes a history line naming the operator and wakes the instance's due deliveries after
the commit. Attempts that were already running when the rule matched (other slots of
Max Concurrent Deliveries) finish; the rest of the blocking attempt's own claimed batch
is put back unattempted by the runner.

A blocking delivery is Failed, a final state, but it is work still to do: the retention
cleanup (not built yet) must keep a message whose delivery blocks an instance, or
nobody could release it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.engine.history import add_line
from b2bhub.models import Delivery, PluginInstance


@dataclass(frozen=True)
class Blocker:
    """What blocks an instance: the delivery, its message and the rule's history."""

    instance: str
    delivery_id: int
    message_id: int | None  # None: the delivery no longer exists


def block(session: Session, target: str, delivery_id: int, message_id: int, rule: str,
          actor: str, now: datetime) -> dict | None:
    """Block ``target`` by the delivery that just failed by ``rule``, unless another
    delivery blocks it already; returns the history line to write with the settlement's
    lines (None: it was blocked already)."""
    done = session.execute(update(PluginInstance).where(
        PluginInstance.name == target, PluginInstance.blocked_by_delivery_id.is_(None),
    ).values(blocked_by_delivery_id=delivery_id)
        .execution_options(synchronize_session=False)).rowcount
    if not done:
        return None
    return {"message_id": message_id, "delivery_id": delivery_id, "type": "instance_blocked",
            "actor": actor,
            "text": f"{target}: blocked by business rule {rule}: its further deliveries "
                    f"wait until delivery {delivery_id} is resubmitted or skipped",
            "data": {"instance": target, "blocked_by": delivery_id, "rule": rule}}


def blocks_instance(session: Session, delivery: Delivery) -> bool:
    """Whether ``delivery`` is the one that blocks its target instance."""
    return session.scalar(select(PluginInstance.id).where(
        PluginInstance.name == delivery.target,
        PluginInstance.blocked_by_delivery_id == delivery.id)) is not None


def release(session: Session, delivery: Delivery, actor: str, verb: str,
            now: datetime) -> bool:
    """Release the instance ``delivery`` blocks, in the operator's transaction, with a
    line naming the operator (the caller wakes its due deliveries). False when the
    delivery blocks no instance."""
    done = session.execute(update(PluginInstance).where(
        PluginInstance.name == delivery.target,
        PluginInstance.blocked_by_delivery_id == delivery.id,
    ).values(blocked_by_delivery_id=None)
        .execution_options(synchronize_session=False)).rowcount
    if not done:
        return False
    add_line(session, delivery.message_id, "instance_released",
             f"{actor} released {delivery.target} ({verb} of delivery {delivery.id}): its "
             "waiting deliveries go out again", actor=actor, delivery_id=delivery.id,
             now=now, data={"instance": delivery.target, "blocked_by": delivery.id})
    return True


def first_waiting_due(session: Session, target: str):
    """The earliest due time of the instance's deliveries that wait to be claimed: a
    resubmitted blocker is put there, so it goes out before the ones it held back."""
    return session.scalar(select(Delivery.due_at).where(
        Delivery.target == target, Delivery.state.in_(["queued", "retrying", "stalled"]))
        .order_by(Delivery.due_at).limit(1))


def blocked_instances(session: Session) -> dict[str, Blocker]:
    """Every blocked instance by name, with its blocking delivery."""
    rows = session.execute(
        select(PluginInstance.name, PluginInstance.blocked_by_delivery_id, Delivery.message_id)
        .outerjoin(Delivery, Delivery.id == PluginInstance.blocked_by_delivery_id)
        .where(PluginInstance.blocked_by_delivery_id.is_not(None))).all()
    return {name: Blocker(name, delivery_id, message_id)
            for name, delivery_id, message_id in rows}
