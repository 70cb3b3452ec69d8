"""Derive a message's status from the states of its deliveries (SPEC 11).

The status is never set by a plugin: the state machine recomputes it with
:func:`derive_status` in the same transaction as the delivery change that caused it.
Plain Python: no Flask, no SQLAlchemy, no Celery.
"""

from __future__ import annotations

from collections.abc import Iterable

from b2bhub.domain.states import DeliveryState, FailureKind, MessageStatus

#: Statuses that raise the ``message_failed`` alert.
ALERTING_STATUSES = frozenset({MessageStatus.ERROR, MessageStatus.BUSINESS_ERROR})

#: Message statuses ranked highest first, for the per-delivery contributions below.
_PRECEDENCE = (
    MessageStatus.ERROR,
    MessageStatus.BUSINESS_ERROR,
    MessageStatus.STALLED,
    MessageStatus.DEFERRED,
    MessageStatus.IN_PROGRESS,
    MessageStatus.RETRYING,
    MessageStatus.AWAITING_RECEIPT,
    MessageStatus.DELIVERED,
    MessageStatus.CANCELLED,
)
_RANK = {status: rank for rank, status in enumerate(_PRECEDENCE)}

#: What one delivery in a non-failed state says about its message.
_STATE_STATUS = {
    DeliveryState.QUEUED: MessageStatus.IN_PROGRESS,
    DeliveryState.IN_PROGRESS: MessageStatus.IN_PROGRESS,
    DeliveryState.RETRYING: MessageStatus.RETRYING,
    DeliveryState.AWAITING_RECEIPT: MessageStatus.AWAITING_RECEIPT,
    DeliveryState.DEFERRED: MessageStatus.DEFERRED,
    DeliveryState.STALLED: MessageStatus.STALLED,
    DeliveryState.DELIVERED: MessageStatus.DELIVERED,
    DeliveryState.SKIPPED: MessageStatus.DELIVERED,
    DeliveryState.CANCELLED: MessageStatus.CANCELLED,
}

Delivery = tuple[DeliveryState | str, FailureKind | str | None]


def derive_status(deliveries: Iterable[Delivery]) -> MessageStatus:
    """Return the message status for its deliveries' ``(state, failure_kind)`` pairs.

    Precedence, highest first (the first row that applies wins)::

        | rule                                             | status           |
        |--------------------------------------------------|------------------|
        | no deliveries at all                             | not_routed       |
        | any failed, failure_kind technical (or None)     | error            |
        | any failed, failure_kind business                | business_error   |
        | any stalled                                      | stalled          |
        | any deferred                                     | deferred         |
        | every delivery queued                            | received         |
        | any in_progress or queued                        | in_progress      |
        | any retrying                                     | retrying         |
        | any awaiting_receipt                             | awaiting_receipt |
        | any delivered or skipped (rest cancelled)        | delivered        |
        | every delivery cancelled                         | cancelled        |

    Work still to do on our side (queued, in progress) ranks above waiting for a
    partner (retrying, awaiting a receipt), so a message is not shown as waiting while
    we still owe it an attempt. ``failure_kind`` is only read for failed deliveries.
    ``refused`` and ``collection_error`` are set at intake, never derived here.
    States and kinds may be enum members or their string values; an unknown value
    raises ``ValueError`` so a typo cannot silently change a status.
    """
    pairs = [_normalise(state, kind) for state, kind in deliveries]
    if not pairs:
        return MessageStatus.NOT_ROUTED
    if all(state is DeliveryState.QUEUED for state, _ in pairs):
        return MessageStatus.RECEIVED
    return min((_delivery_status(state, kind) for state, kind in pairs), key=_RANK.__getitem__)


def _normalise(state: DeliveryState | str,
               kind: FailureKind | str | None) -> tuple[DeliveryState, FailureKind | None]:
    """Turn stored strings into enum members (the database keeps plain text)."""
    return DeliveryState(state), FailureKind(kind) if kind else None


def _delivery_status(state: DeliveryState, kind: FailureKind | None) -> MessageStatus:
    """What one delivery contributes; a failure without a kind counts as technical."""
    if state is DeliveryState.FAILED:
        if kind is FailureKind.BUSINESS:
            return MessageStatus.BUSINESS_ERROR
        return MessageStatus.ERROR
    return _STATE_STATUS[state]
