"""Operator actions (SPEC 12): the state machine's transitions that a person starts.

Each action runs in the caller's transaction, writes a ``*_requested`` history line
naming the operator, then the ``delivery_changed`` lines of what it moved, re-derives the
message status and queues the wake-ups for after the commit. An action that does not
apply to the delivery's state is refused with :class:`ActionRefused` and changes nothing.

==============  ===================================  ===========
action          from                                 to
==============  ===================================  ===========
redeliver       failed, stalled, retrying            queued (failures reset)
send again      delivered                            queued (same external id)
cancel          queued, retrying, stalled, deferred, cancelled
                awaiting_receipt, in_progress
redispatch      (message) new deliveries for new routes; stalled ones re-queued
resubmit        failed, blocking its sequence or     queued; parked ones queued behind it;
                its instance                         the instance released
skip            failed, blocking its sequence or     skipped; parked ones released; the
                its instance                         instance released
==============  ===================================  ===========

A failed delivery blocks its sequence when its target is ordered or when deliveries are
parked behind it (a business rule that blocks the sequence); see
:mod:`b2bhub.engine.sequences`. It blocks its instance when a business rule with
``block: "instance"`` failed it (:mod:`b2bhub.engine.blocking`): a resubmitted blocker
goes out before the deliveries it held back. Redeliver of a blocker is a resubmit.

Cancelling an attempt in progress needs no signal to the worker: its outcome is refused
by the fence (the delivery is no longer in progress) and recorded as stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_, STATUS_LABELS, joined
from b2bhub.domain.states import LABELS, DeliveryState, MessageStatus
from b2bhub.engine import blocking
from b2bhub.engine.dispatch import TEST_SOURCE, create_deliveries, route_cache
from b2bhub.engine.history import add_line, resolve_alert
from b2bhub.engine.machine import receipts, sequence, wake
from b2bhub.engine.sequences import blocks_sequence
from b2bhub.engine.settings import load_settings
from b2bhub.engine.status import refresh_statuses
from b2bhub.engine.wakeups import after_commit
from b2bhub.models import Delivery, Message, MessageAttribute

S = DeliveryState


class ActionRefused(Exception):
    """The action does not apply to the current state; nothing was changed."""


class UnknownObject(LookupError):
    """No message or delivery with that id."""


@dataclass
class ActionResult:
    changed: bool
    text: str
    deliveries: list[int]


REDELIVERABLE = {S.FAILED, S.STALLED, S.RETRYING}
CANCELLABLE = {S.QUEUED, S.RETRYING, S.STALLED, S.DEFERRED, S.AWAITING_RECEIPT,
               S.IN_PROGRESS}


def redeliver(session: Session, delivery_id: int, actor: str, now: datetime) -> ActionResult:
    """Send a failed, stalled or retrying delivery again from the start."""
    return _requeue(session, delivery_id, actor, now, REDELIVERABLE, "redeliver_requested",
                    N_("redeliver"))


@dataclass
class BulkResult:
    redelivered: list[int]
    skipped: list[int]  # selected, but changed before their turn: left as they were
    more: bool  # more matched than were taken: run it again


def redeliver_many(session: Session, selection: Select, max_count: int, actor: str,
                   now: datetime) -> BulkResult:
    """The bulk Redeliver of the API and the UI: the failed, stalled or retrying
    deliveries ``selection`` (a query of deliveries) matches, oldest first, at most
    ``max_count``, each redelivered as the single action does (its own history line
    naming ``actor``).

    A delivery that changes between the selection and its turn (a worker claimed a
    retrying one, another operator redelivered it) is skipped and left exactly as it
    was: its redeliver runs in a savepoint that is rolled back, so it leaves no history
    line. The others still go; the caller commits and reports both lists. One changed
    row never costs the operator the whole batch."""
    ids = list(session.scalars(
        selection.with_only_columns(Delivery.id)
        .where(Delivery.state.in_(sorted(REDELIVERABLE)))
        .order_by(Delivery.id).limit(max_count + 1)))
    done, skipped = [], []
    for delivery_id in ids[:max_count]:
        try:
            with session.begin_nested():
                redeliver(session, delivery_id, actor, now)
        except ActionRefused:
            skipped.append(delivery_id)
        else:
            done.append(delivery_id)
    return BulkResult(done, skipped, len(ids) > max_count)


def resubmit(session: Session, delivery_id: int, actor: str, now: datetime) -> ActionResult:
    """A new attempt for the failed delivery that blocks its sequence; the deliveries
    parked behind it queue again and wait their turn behind it."""
    _blocking(session, delivery_id, N_("resubmit"))
    return _requeue(session, delivery_id, actor, now, {S.FAILED}, "resubmit_requested",
                    N_("resubmit"))


def skip(session: Session, delivery_id: int, actor: str, now: datetime) -> ActionResult:
    """End the failed delivery that blocks its sequence as Skipped and release the
    deliveries parked behind it, in order."""
    delivery = _blocking(session, delivery_id, N_("skip"))
    add_line(session, delivery.message_id, "skip_requested",
             f"{actor} skipped the delivery to {delivery.target}", actor=actor,
             delivery_id=delivery_id, now=now)
    _move(session, delivery, S.SKIPPED, now, actor, f"{delivery.target}: skipped",
          settled_at=now, next_wake_at=None)
    released = sequence.release(session, delivery, now, actor, load_settings(session))
    unblocked = _release_instance(session, delivery, actor, "skip", now)
    refresh_statuses(session, [delivery.message_id], now, actor)
    text = f"skipped; {released} parked delivery(ies) released"
    return ActionResult(True, text + (f"; {delivery.target} released" if unblocked else ""),
                        [delivery_id])


class ReceiptRefused(ActionRefused):
    """A receipt for a delivery that is not awaiting one (settled already, or failed
    when its deadline passed). The refusal is recorded: commit before reporting it."""


def record_receipt(session: Session, delivery_id: int, completed: bool, text: str,
                   actor: str, now: datetime) -> ActionResult:
    """Settle a delivery awaiting its receipt as an external system reports it (SPEC 8:
    a handoff finished or failed): delivered when ``completed``, else failed."""
    delivery = _delivery(session, delivery_id)
    result = "completed" if completed else "failed"
    said = f"{actor} reported the receipt: {result}" + (f": {text}" if text else "")
    if not receipts.settle_receipt(session, delivery_id, delivery.receipt_ref, completed,
                                   said, now, actor, kind="receipt"):
        raise ReceiptRefused(N_("delivery %(id)s is %(state)s: only a delivery awaiting "
                                "its receipt takes one (the refusal is in its history)",
                                id=delivery_id, state=_label(delivery.state)))
    return ActionResult(True, f"receipt {result}", [delivery_id])


def _blocking(session: Session, delivery_id: int, verb: str) -> Delivery:
    delivery = _delivery(session, delivery_id)
    if is_blocker(session, delivery):
        return delivery
    raise ActionRefused(N_("delivery %(id)s is %(state)s: %(verb)s takes a failed delivery "
                           "that blocks its sequence or its instance (use redeliver "
                           "otherwise)", id=delivery_id, state=_label(delivery.state),
                           verb=verb))


def is_blocker(session: Session, delivery: Delivery) -> bool:
    """A failed delivery that blocks its sequence or its instance: Resubmit or Skip."""
    return delivery.state == S.FAILED and (blocks_sequence(session, delivery)
                                           or blocking.blocks_instance(session, delivery))


def send_again(session: Session, delivery_id: int, actor: str, now: datetime) -> ActionResult:
    """Send a delivered delivery again (a lost downstream copy)."""
    return _requeue(session, delivery_id, actor, now, {S.DELIVERED}, "send_again_requested",
                    N_("send again"))


def cancel_delivery(session: Session, delivery_id: int, actor: str,
                    now: datetime) -> ActionResult:
    delivery = _delivery(session, delivery_id)
    if delivery.state not in CANCELLABLE:
        raise ActionRefused(N_("delivery %(id)s is %(state)s: only a delivery that is not "
                               "final can be cancelled", id=delivery_id,
                               state=_label(delivery.state)))
    add_line(session, delivery.message_id, "cancel_requested",
             f"{actor} cancelled the delivery to {delivery.target}", actor=actor,
             delivery_id=delivery_id, now=now)
    _move(session, delivery, S.CANCELLED, now, actor, f"{delivery.target}: cancelled",
          settled_at=now, lease_owner=None, lease_until=None, next_wake_at=None)
    refresh_statuses(session, [delivery.message_id], now, actor)
    return ActionResult(True, "cancelled", [delivery_id])


def cancel_message(session: Session, message_id: int, actor: str,
                   now: datetime) -> ActionResult:
    """Cancel every delivery of the message that is not final yet."""
    message = _message(session, message_id)
    open_ids = [d.id for d in message.deliveries if d.state in CANCELLABLE]
    if not open_ids and message.status != MessageStatus.NOT_ROUTED:
        raise ActionRefused(N_("message %(id)s is %(status)s: nothing left to cancel",
                               id=message_id, status=_label(message.status)))
    add_line(session, message_id, "cancel_requested", f"{actor} cancelled the message",
             actor=actor, now=now)
    for delivery_id in open_ids:
        delivery = session.get(Delivery, delivery_id)
        _move(session, delivery, S.CANCELLED, now, actor, f"{delivery.target}: cancelled",
              settled_at=now, lease_owner=None, lease_until=None, next_wake_at=None)
    if not message.deliveries:
        _set_message_status(session, message, MessageStatus.CANCELLED, now, actor)
    refresh_statuses(session, [message_id], now, actor)
    return ActionResult(True, "cancelled", open_ids)


def redispatch(session: Session, message_id: int, actor: str, now: datetime) -> ActionResult:
    """Match the routes again (with the document types its envelope was found to hold at
    intake): create the deliveries the message lacks and re-queue its stalled ones;
    existing deliveries are neither duplicated nor otherwise touched."""
    message = _message(session, message_id)
    if message.status in (MessageStatus.REFUSED, MessageStatus.COLLECTION_ERROR,
                          MessageStatus.CANCELLED) and not message.deliveries:
        raise ActionRefused(N_("message %(id)s is %(status)s: it cannot be dispatched",
                               id=message_id, status=_label(message.status)))
    if message.source == TEST_SOURCE:
        raise ActionRefused(N_("message %(id)s is a connection test: it is never routed",
                               id=message_id))
    existing = list(message.deliveries)
    types = session.scalars(select(MessageAttribute.value).where(
        MessageAttribute.message_id == message_id,
        MessageAttribute.name == "document_type")).all()
    targets = route_cache.table(session).targets(message.source, message.from_party,
                                                  message.to_party, types)
    new = create_deliveries(session, message, targets, now, actor, load_settings(session))
    stalled = [d for d in existing if d.state == S.STALLED]
    after_commit(session, [(d.id, d.target) for d in existing if d.state == S.QUEUED])
    for delivery in stalled:
        _wake_again(session, delivery, now, actor, "redispatch")
    changed = bool(new or stalled)
    text = _redispatch_text(new, stalled)
    add_line(session, message_id, "redispatch_requested", f"{actor}: {text}", actor=actor,
             now=now, data={"new": [d.target for d in new], "requeued": len(stalled)})
    refresh_statuses(session, [message_id], now, actor)
    return ActionResult(changed, text, [d.id for d in new] + [d.id for d in stalled])


def _redispatch_text(new: list[Delivery], stalled: list[Delivery]) -> str:
    if not new and not stalled:
        return "redispatch: nothing is new"
    parts = []
    if new:
        parts.append("new deliveries to " + ", ".join(d.target for d in new))
    if stalled:
        parts.append(f"{len(stalled)} stalled delivery(ies) queued again")
    return "redispatch: " + "; ".join(parts)


def _requeue(session: Session, delivery_id: int, actor: str, now: datetime,
             allowed: set[str], line_type: str, verb: str) -> ActionResult:
    delivery = _delivery(session, delivery_id)
    if delivery.state not in allowed:
        raise ActionRefused(N_("delivery %(id)s is %(state)s: %(verb)s takes a delivery "
                               "that is %(states)s", id=delivery_id,
                               state=_label(delivery.state), verb=verb,
                               states=joined((_label(s) for s in sorted(allowed)), ", ")))
    add_line(session, delivery.message_id, line_type,
             f"{actor} asked to {verb} the delivery to {delivery.target}", actor=actor,
             delivery_id=delivery_id, now=now)
    failed = delivery.state == S.FAILED
    blocks = failed and blocks_sequence(session, delivery)
    holds = failed and blocking.blocks_instance(session, delivery)
    # a blocker of its instance goes out before the deliveries it held back
    first = blocking.first_waiting_due(session, delivery.target) if holds else None
    _wake_again(session, delivery, now, actor, verb, failures=0, failure_kind=None,
                settled_at=None, due_at=min(first, now) if first else now)
    if blocks:
        # never parked behind itself: the parked ones queue again behind it
        sequence.release(session, delivery, now, actor, load_settings(session))
    if holds:
        _release_instance(session, delivery, actor, verb, now)
    refresh_statuses(session, [delivery.message_id], now, actor)
    return ActionResult(True, f"{verb}: queued", [delivery_id])


def _release_instance(session: Session, delivery: Delivery, actor: str, verb: str,
                      now: datetime) -> bool:
    """Release the instance the delivery blocks (if it does) and wake its deliveries."""
    if not blocking.release(session, delivery, actor, verb, now):
        return False
    wake.wake_target(session, delivery.target, now)
    return True


def _wake_again(session: Session, delivery: Delivery, now: datetime, actor: str, why: str,
                due_at: datetime | None = None, **values) -> None:
    """Back to the queue, due now (or at ``due_at``), woken after commit; the attempt
    number keeps growing."""
    settings = load_settings(session)
    _move(session, delivery, S.QUEUED, now, actor, f"{delivery.target}: queued ({why})",
          due_at=due_at or now, wake_count=1,
          next_wake_at=now + timedelta(seconds=settings.wake_delay(1)), **values)
    resolve_alert(session, "delivery_stalled", f"delivery:{delivery.id}", now)
    after_commit(session, [(delivery.id, delivery.target)])


def _move(session: Session, delivery: Delivery, to: str, now: datetime, actor: str,
          text: str, **values) -> None:
    """One guarded transition through the state machine; refused if the row changed."""
    if not sequence.move(session, delivery, to, now, actor, text, **values):
        raise ActionRefused(N_("delivery %(id)s changed meanwhile; try again",
                               id=delivery.id))


def _set_message_status(session: Session, message: Message, status: str, now: datetime,
                        actor: str) -> None:
    old = message.status
    message.status, message.updated_at = status, now
    add_line(session, message.id, "status_changed", f"{LABELS[old]} → {LABELS[status]}",
             actor=actor, now=now, data={"from": old, "to": status})
    resolve_alert(session, "message_not_routed", f"message:{message.id}", now)


def _label(status: str) -> str:
    """A status's or state's label, a text a page shows in the reader's language."""
    return STATUS_LABELS.get(status) or LABELS[status]


def _delivery(session: Session, delivery_id: int) -> Delivery:
    delivery = session.get(Delivery, delivery_id)
    if delivery is None:
        raise UnknownObject(N_("no delivery %(id)s", id=delivery_id))
    return delivery


def _message(session: Session, message_id: int) -> Message:
    message = session.scalar(select(Message).where(Message.id == message_id))
    if message is None:
        raise UnknownObject(N_("no message %(id)s", id=message_id))
    return message


#: The actions by the names the API and the UI give them (``POST .../<action>``).
MESSAGE_ACTIONS = {"redispatch": redispatch, "cancel": cancel_message}
DELIVERY_ACTIONS = {"redeliver": redeliver, "send-again": send_again,
                    "cancel": cancel_delivery, "resubmit": resubmit, "skip": skip}
