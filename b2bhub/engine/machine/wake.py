"""Wake-ups of due, unclaimed deliveries, and the stall of those woken in vain.

:func:`wake_due` (a sweep step) counts a wake-up on every due delivery nobody claimed;
:func:`stall_unclaimed` moves one woken ``stall_after`` times without a claim from
``queued`` or ``retrying`` to ``stalled`` and raises an alert. How many wake-ups a target
needs is :func:`wakeups_per_target`'s; they go out after the commit
(:mod:`b2bhub.engine.wakeups`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.orm import Session

from b2bhub.domain.states import DeliveryState
from b2bhub.engine import sequences, wakeups
from b2bhub.engine.history import add_lines, raise_alert
from b2bhub.engine.settings import DeliverySettings, load_settings
from b2bhub.engine.status import refresh_statuses
from b2bhub.models import Delivery, InstanceState, PluginInstance

S = DeliveryState


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


def _not_waiting(session: Session) -> list:
    """Conditions leaving out deliveries that wait their turn in an ordered sequence:
    nobody failed to claim them, so they are neither woken nor stalled."""
    ordered = sequences.ordered_targets(session)
    return [~sequences.waiting_in_sequence(ordered)] if ordered else []
