"""Receipts: a delivery ``awaiting_receipt`` ends ``delivered`` or ``failed``.

:func:`settle_receipt` settles it by the receipt that came (an AS2 MDN, or one reported
through the API); :func:`fail_overdue_receipts` (a sweep step) fails it once the
deadline passed without one. A failure that blocks its sequence parks what follows it
(:func:`.sequence.park_behind`), whichever path failed it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.domain.states import LABELS, DeliveryState, FailureKind
from b2bhub.engine import sequences
from b2bhub.engine.history import add_line, add_lines
from b2bhub.engine.machine.sequence import park_behind
from b2bhub.engine.status import refresh_statuses
from b2bhub.models import Delivery

S = DeliveryState


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


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds // 60}m"
    return f"{seconds}s"
