"""MDNs partners send for messages we sent: asynchronous ones arrive at the AS2
endpoint, synchronous ones in the answer to our POST. Both are read here.

An MDN is matched by its Original-Message-ID to the ``as2_outbound`` row of the
delivery (Original-Recipient is not needed: some partners leave it out). It settles a
delivery awaiting a receipt; one that comes after the delivery was settled (a second
MDN, or one after the Receipt Timeout failed it) is refused and logged as
unattributable, and the delivery stays as it was.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.plugin_api import (
    Delivery,
    DeliveryState,
    Payload,
    PayloadStore,
    StoredPayload,
    add_line,
    settle_receipt,
)
from plugins.as2 import lib, profiles
from plugins.as2.models import As2Outbound
from plugins.as2.replies import text_reply

log = logging.getLogger(__name__)
#: an asynchronous MDN may overtake the settlement of the attempt that sent the message
SETTLE_WAIT = 10.0


def looks_like_mdn(found: dict, body: bytes) -> bool:
    kind = found.get("content-type", "").lower()
    if kind.startswith("multipart/report"):
        return True
    return kind.startswith("multipart/signed") and b"multipart/report" in body[:4096].lower()


def original_message(row: As2Outbound, org: profiles.As2Profile,
                     partner: profiles.As2Profile):
    """The pyas2lib view of what we sent, as an MDN parser needs it (MIC, certificate)."""
    message = lib.Message(sender=lib.organization(org), receiver=lib.partner(partner))
    message.message_id = row.as2_message_id
    message.mic = row.mic.encode() if row.mic else None
    message.digest_alg = row.digest_alg
    if not row.mdn_signed:
        message.receiver.mdn_digest_alg = None
    return message


def read_mdn(raw: bytes, find) -> tuple[str | None, str | None, str | None]:
    """(status, detail, original Message-ID) of an MDN; never raises."""
    mdn = lib.Mdn()
    status, detail = mdn.parse(raw, find)
    return status, detail, mdn.orig_message_id


def outcome_text(status: str | None, detail: str | None) -> tuple[bool, str]:
    if status == "processed":
        return True, "MDN processed; MIC verified"
    if status == "processed/warning":
        return False, f"MDN with a warning: {detail}"
    return False, f"negative MDN: {status}: {detail}"


def record_receipt(session: Session, message_id: int, stored: StoredPayload,
                   now: datetime) -> None:
    """The ``receipt`` stage of a message we sent: the latest MDN received."""
    record_stage(session, message_id, "receipt", stored, now)


def record_stage(session: Session, message_id: int, stage: str, stored: StoredPayload,
                 now: datetime) -> None:
    """Record (or replace, on a Send again) a stage of a message after its intake."""
    row = session.scalar(select(Payload).where(Payload.message_id == message_id,
                                               Payload.stage == stage))
    if row is None:
        session.add(Payload(message_id=message_id, stage=stage, digest=stored.digest,
                            size=stored.size, created_at=now))
    else:
        row.digest, row.size, row.created_at = stored.digest, stored.size, now


def receive_mdn(session: Session, store: PayloadStore, raw: bytes, stored_raw, found: dict,
                now: datetime):
    context: dict = {}

    def find(orig_id, _recipient):
        row = session.scalar(select(As2Outbound).where(
            As2Outbound.as2_message_id == lib.message_id_of(orig_id)))
        if row is None:
            return None
        org = profiles.by_party(session, _org_of(session, row))
        partner = profiles.by_party(session, row.partner)
        if org is None or partner is None:
            return None
        context["row"] = row
        return original_message(row, org, partner)

    status, detail, orig_id = read_mdn(raw, find)
    row = context.get("row")
    if row is None:
        log.warning("unattributable MDN for Message-ID %s: no message of ours; %s %s",
                    orig_id, status, detail)
        session.rollback()
        return text_reply(400, f"MDN refused: no message of ours has Message-ID {orig_id}")
    ok, text = outcome_text(status, detail)
    delivery = _wait_settled(session, row)
    record_receipt(session, row.message_id, stored_raw, now)
    if delivery is None or delivery.state != DeliveryState.AWAITING_RECEIPT:
        state = delivery.state if delivery is not None else "gone"
        add_line(session, row.message_id, "mdn_refused",
                 f"{row.target}: MDN for <{row.as2_message_id}> is unattributable: the "
                 f"delivery is {state}; {text}",
                 delivery_id=delivery.id if delivery else None, now=now)
        session.commit()
        log.warning("unattributable MDN for %s: delivery is %s", row.as2_message_id, state)
        return text_reply(200, f"MDN refused: the delivery is {state}")
    settled = settle_receipt(session, delivery.id, row.as2_message_id, ok, text, now,
                                     actor=row.partner)
    session.commit()
    if not settled:
        log.warning("unattributable MDN for %s", row.as2_message_id)
    return text_reply(200, "MDN received" if settled else "MDN refused: already settled")


def _org_of(session: Session, row: As2Outbound) -> str:
    from b2bhub.plugin_api import Message
    return session.scalar(select(Message.from_party).where(Message.id == row.message_id))


def _wait_settled(session: Session, row: As2Outbound) -> Delivery | None:
    """The delivery, once the attempt that sent the message has settled (an MDN posted
    at once may arrive before that settlement commits)."""
    deadline = time.monotonic() + SETTLE_WAIT
    while True:
        delivery = session.scalar(select(Delivery).where(
            Delivery.message_id == row.message_id, Delivery.target == row.target))
        if delivery is None or delivery.state != DeliveryState.IN_PROGRESS \
                or time.monotonic() > deadline:
            return delivery
        session.rollback()
        time.sleep(0.05)
