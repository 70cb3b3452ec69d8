"""MDNs partners send for messages we sent: asynchronous ones arrive at the AS2
endpoint, synchronous ones in the answer to our POST. Both are read here.

An MDN is matched by its Original-Message-ID to the ``as2_outbound`` row of the
delivery (Original-Recipient is not needed: some partners leave it out). It settles a
delivery awaiting a receipt; one that comes after the delivery was settled (a second
MDN, or one after the Receipt Timeout failed it) is refused and logged as
unattributable, and the delivery stays as it was. One that matches no message of ours
is kept as an unattributable receipt (:func:`_unmatched`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.plugin import (
    TEST_SOURCE,
    DeliveryState,
    DeliveryView,
    NewMessage,
    PayloadStore,
    StoredPayload,
    add_line,
    delivery_of,
    finish_test_message,
    latest_line,
    message_view,
    raise_alert,
    record_stage,
    settle_receipt,
    store_refused,
)
from plugins.as2 import lib, presets, profiles
from plugins.as2.models import As2Outbound
from plugins.as2.replies import party_name, text_reply

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
    message = lib.Message(sender=lib.organization(org, partner=partner.party),
                          receiver=lib.partner(partner))
    message.message_id = row.as2_message_id
    message.mic = row.mic.encode() if row.mic else None
    message.digest_alg = row.digest_alg
    if not row.mdn_signed:
        message.receiver.mdn_digest_alg = None
    return message


@dataclass
class Receipt:
    """An MDN as read: pyas2lib's status and detail, and what the judgement needs."""

    status: str | None
    detail: str | None
    orig_id: str | None
    signed: bool = False
    mic: str | None = None  # the Received-Content-MIC, as sent
    signature_error: str | None = None  # our check of its signature failed


def read_mdn(raw: bytes, find) -> Receipt:
    """The MDN's receipt; never raises."""
    mdn = lib.Mdn()
    with lib.mdn_verifying() as check:
        status, detail = mdn.parse(raw, find)
    head = lib.read_headers(raw.partition(b"\r\n\r\n")[0])
    receipt = Receipt(status, detail, mdn.orig_message_id,
                      signed=head.get("content-type", "").lower().startswith(
                          "multipart/signed"))
    if check.error is not None:
        receipt.signature_error = str(check.error) or type(check.error).__name__
    try:
        for part in mdn.payload.walk() if mdn.payload is not None else ():
            if part.get_content_type() == "message/disposition-notification":
                fields = part.get_payload()[-1]
                receipt.mic = (fields.get("Received-Content-MIC") or "").strip() or None
    except Exception:  # a report pyas2lib could not read either: no MIC
        pass
    return receipt


#: pyas2lib's details of an MDN it could not read itself (not the partner's disposition)
UNREADABLE = ("Failed to parse received MDN", "mdn-not-found")
_UNSIGNED = "Expected signed MDN but unsigned MDN returned"


#: the partner's AS2 profile switch that each receipt refusal can be answered by: the
#: refusal's text names it (issue: a refusal says how to proceed). A bad signature, an
#: unreadable MDN and the partner's own negative disposition have none.
SWITCH_HINTS = {
    "unsigned": "to ask this partner for unsigned receipts instead, switch off "
                "mdn_signed in its AS2 profile",
    "no_mic": "to accept such receipts from this partner, switch on "
              "accept_mdn_without_mic in its AS2 profile (pyas2lib and django-pyas2 "
              "leave the MIC out of their receipts for unsigned messages)",
    "mic_mismatch": "if the partner computes the MIC over the content as binary "
                    "(without the CRLF canonicalisation of text), switch on "
                    "canonicalize_as_binary in its AS2 profile",
}
#: each hint's switch and the value it asks for: the hint names the presets that set it
#: (from the presets' table, plugins.as2.presets)
_HINT_SWITCHES = {"unsigned": ("mdn_signed", False), "no_mic": ("accept_mdn_without_mic", True),
                  "mic_mismatch": ("canonicalize_as_binary", True)}
SWITCH_HINTS = {case: hint + presets.naming(*_HINT_SWITCHES[case])
                for case, hint in SWITCH_HINTS.items()}


def judge(receipt: Receipt, accept_without_mic: bool = False) -> tuple[bool, str]:
    """(delivered, history text) of a receipt; each case its own words (README "AS2
    receipts"): the partner's negative disposition, a signature failing our check, a MIC
    that differs, a signed MDN without MIC (a failure unless the partner's profile has
    ``accept_mdn_without_mic``, then delivered with a warning), an unsigned MDN where a
    signed one was asked for, an MDN we could not read. A refusal a profile switch can
    answer names it (:data:`SWITCH_HINTS`)."""
    status, detail = receipt.status, receipt.detail
    if receipt.signature_error is not None:
        return False, (f"MDN signature failed our verification: {receipt.signature_error}; "
                       "the partner's disposition is not trusted")
    if status == "failed/Failure" and detail == _UNSIGNED:
        return False, ("unsigned MDN, although a signed one was asked for; "
                       + SWITCH_HINTS["unsigned"])
    if status == "failed/Failure" and detail and detail.startswith(UNREADABLE):
        return False, f"MDN could not be read: {detail}"
    if status == "processed/warning" and detail == "Message Integrity check failed.":
        return False, (f"MIC mismatch: the MDN confirms {receipt.mic or '?'}, which is not "
                       "the MIC of what we sent; " + SWITCH_HINTS["mic_mismatch"])
    if status == "processed":
        if receipt.signed and not receipt.mic:
            if accept_without_mic:
                return True, ("MDN processed; warning: signed MDN without "
                              "Received-Content-MIC, accepted (accept_mdn_without_mic): "
                              "MIC not verified")
            return False, ("signed MDN without Received-Content-MIC: nothing to compare, "
                           "the MIC is not verified (RFC 4130 7.4.3); "
                           + SWITCH_HINTS["no_mic"])
        if receipt.mic:
            return True, "MDN processed; MIC verified"
        return True, "MDN processed (unsigned, without MIC: nothing verified)"
    if status == "processed/warning":
        return False, f"MDN with a warning from the partner: {detail}"
    return False, f"negative MDN from the partner: {status}: {detail}"


def record_receipt(session: Session, message_id: int, stored: StoredPayload,
                   now: datetime) -> None:
    """The ``receipt`` stage of a message we sent: the latest MDN received."""
    record_stage(session, message_id, "receipt", stored, now)


def receive_mdn(session: Session, store: PayloadStore, raw: bytes, stored_raw, found: dict,
                now: datetime, instance: str = "as2"):
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
        context["row"], context["partner"] = row, partner
        return original_message(row, org, partner)

    receipt = read_mdn(raw, find)
    status, detail, orig_id = receipt.status, receipt.detail, receipt.orig_id
    row = context.get("row")
    if row is None:
        return _unmatched(session, instance, found, stored_raw, orig_id, status, detail, now)
    ok, text = judge(receipt, bool(context["partner"].get("accept_mdn_without_mic")))
    if row.target == TEST_SOURCE:
        return _test_mdn(session, row, receipt, ok, text, stored_raw, now)
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


#: the history line of a connection test's asynchronous MDN (:mod:`.selftest` reads it)
TEST_MDN_LINE = "connection_test_mdn"


def _test_mdn(session: Session, row: As2Outbound, receipt: Receipt, ok: bool, text: str,
              stored_raw: StoredPayload, now: datetime):
    """The asynchronous MDN of a connection test's message (:mod:`.selftest`): recorded
    on it, with what the test reports (the test waiting for it reads the line); a test
    that stopped waiting gets its outcome here."""
    record_receipt(session, row.message_id, stored_raw, now)
    add_line(session, row.message_id, TEST_MDN_LINE,
             f"MDN for <{row.as2_message_id}>: {text}", actor=row.partner,
             data={"ok": ok, "receipt": asdict(receipt)}, now=now)
    session.commit()
    finish_pending_test(session, row.message_id, now)
    return text_reply(200, "MDN received")


def finish_pending_test(session: Session, message_id: int, now: datetime) -> None:
    """End a test message that awaits its asynchronous MDN, by the MDN recorded."""
    message = message_view(session, message_id)
    line = latest_line(session, message_id, TEST_MDN_LINE)
    if message is None or line is None or message.status != "awaiting_receipt":
        return
    finish_test_message(session, message_id, bool(line.data.get("ok")),
                        f"connection test: {line.text}", now)
    session.commit()


#: the alert of an MDN no message of ours matches
UNMATCHED_ALERT = "as2_unattributable_mdn"


def _unmatched(session: Session, instance: str, found: dict, stored_raw: StoredPayload,
               orig_id: str | None, status: str | None, detail: str | None,
               now: datetime):
    """An MDN no message of ours matches: kept as an unattributable receipt, a Refused
    message of the receiver instance with the MDN as its ``raw`` stage (so retention and
    the nightly cleanup remove it with the rest), the reason in its history and an
    ``as2_unattributable_mdn`` alert for the operator. The partner gets 200 with the
    reason: RFC 4130 gives the answer to an MDN's POST no other meaning, and a refusal
    would only make it post the same MDN again."""
    wanted = orig_id or "(none)"
    reason = (f"unattributable MDN: no message of ours has Message-ID <{wanted}> "
              f"(disposition {status}: {detail})")
    new = NewMessage(source=instance, from_party=party_name(lib.unquote(found.get("as2-from"))),
                     to_party=party_name(lib.unquote(found.get("as2-to"))),
                     stages={"raw": (stored_raw.digest, stored_raw.size)},
                     external_id=lib.message_id_of(found.get("message-id")))
    message_id = store_refused(session, new, reason, now)
    raise_alert(session, UNMATCHED_ALERT, f"{new.from_party} <{wanted}>"[:200],
                f"An MDN from {new.from_party} names Message-ID <{wanted}>, which no message "
                "of ours has; it is kept as message " f"{message_id}.",
                message_id=message_id, now=now)
    session.commit()
    log.warning("unattributable MDN for Message-ID %s: no message of ours; %s %s",
                orig_id, status, detail)
    return text_reply(200, f"MDN received, but no message of ours has Message-ID <{wanted}>: "
                      "kept as unattributable", message_id=message_id)


def _org_of(session: Session, row: As2Outbound) -> str | None:
    message = message_view(session, row.message_id)
    return None if message is None else message.from_party


def _wait_settled(session: Session, row: As2Outbound) -> DeliveryView | None:
    """The delivery, once the attempt that sent the message has settled (an MDN posted
    at once may arrive before that settlement commits)."""
    deadline = time.monotonic() + SETTLE_WAIT
    while True:
        delivery = delivery_of(session, row.message_id, row.target)
        if delivery is None or delivery.state != DeliveryState.IN_PROGRESS \
                or time.monotonic() > deadline:
            return delivery
        session.rollback()
        time.sleep(0.05)
