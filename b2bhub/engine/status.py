"""Store the derived message status in the transaction of the change that caused it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.domain.states import LABELS, MessageStatus
from b2bhub.domain.status import ALERTING_STATUSES, derive_status
from b2bhub.engine.history import add_lines, raise_alert, resolve_alert
from b2bhub.models import Delivery, Message

#: statuses set outside the deliveries (at intake, or an operator cancelling a message
#: that had none); not re-derived while the message has no deliveries
INTAKE_STATUSES = {MessageStatus.REFUSED, MessageStatus.COLLECTION_ERROR,
                   MessageStatus.CANCELLED}


def refresh_statuses(session: Session, message_ids: Iterable[int], now: datetime,
                     actor: str = "") -> dict[int, str]:
    """Re-derive the status of these messages; write what changed with a history line.

    Returns {message id: new status} for the messages whose status changed.
    """
    ids = sorted(set(message_ids))
    if not ids:
        return {}
    _lock_messages(session, ids)
    states: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
    for chunk in _chunks(ids, 500):
        rows = session.execute(select(Delivery.message_id, Delivery.state,
                                      Delivery.failure_kind)
                               .where(Delivery.message_id.in_(chunk)))
        for message_id, state, kind in rows:
            states[message_id].append((state, kind))
    current = _current_statuses(session, ids)
    changed = {}
    for message_id, old in current.items():
        if old in INTAKE_STATUSES and not states[message_id]:
            continue
        new = derive_status(states[message_id]).value
        if new != old:
            changed[message_id] = new
    _write_changes(session, changed, current, now, actor)
    return changed


def _lock_messages(session: Session, ids: list[int]) -> None:
    """Serialise status derivation per message (PostgreSQL, READ COMMITTED).

    Two settlements of one message's deliveries would otherwise each read the other's
    delivery as it was before, and store a status derived from half the picture. Rows
    are locked in id order (after the delivery rows the caller changed: deliveries
    first, then messages, everywhere), so concurrent batches cannot deadlock. SQLite
    needs nothing: one writer at a time.
    """
    if session.get_bind().dialect.name != "postgresql":
        return
    for chunk in _chunks(ids, 500):
        session.execute(select(Message.id).where(Message.id.in_(chunk))
                        .order_by(Message.id).with_for_update())


def _current_statuses(session: Session, ids: list[int]) -> dict[int, str]:
    out = {}
    for chunk in _chunks(ids, 500):
        out.update(session.execute(select(Message.id, Message.status)
                                   .where(Message.id.in_(chunk))).all())
    return out


def _write_changes(session: Session, changed: dict[int, str], old: dict[int, str],
                   now: datetime, actor: str) -> None:
    by_status: dict[str, list[int]] = defaultdict(list)
    for message_id, status in changed.items():
        by_status[status].append(message_id)
    for status, ids in by_status.items():
        session.execute(update(Message).where(Message.id.in_(ids))
                        .values(status=status, updated_at=now))
    add_lines(session, [
        {"message_id": mid, "type": "status_changed", "actor": actor,
         "text": f"{LABELS[old[mid]]} → {LABELS[new]}", "data": {"from": old[mid], "to": new}}
        for mid, new in changed.items()], now)
    for mid, new in changed.items():
        _message_alerts(session, mid, old[mid], new, now)


def _message_alerts(session: Session, message_id: int, old: str, new: str,
                    now: datetime) -> None:
    subject = f"message:{message_id}"
    if new in ALERTING_STATUSES:
        raise_alert(session, "message_failed", subject,
                    f"message {message_id} ended {LABELS[new]}", message_id, now)
    elif old in ALERTING_STATUSES:
        resolve_alert(session, "message_failed", subject, now)
    if new == MessageStatus.NOT_ROUTED:
        raise_alert(session, "message_not_routed", subject,
                    f"message {message_id}: no route matched", message_id, now)
    elif old == MessageStatus.NOT_ROUTED:
        resolve_alert(session, "message_not_routed", subject, now)


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]
