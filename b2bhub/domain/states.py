"""The names of delivery states and message statuses (SPEC 16: a contract)."""

from __future__ import annotations

from enum import StrEnum


class DeliveryState(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    RETRYING = "retrying"
    AWAITING_RECEIPT = "awaiting_receipt"
    DEFERRED = "deferred"
    STALLED = "stalled"
    DELIVERED = "delivered"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class FailureKind(StrEnum):
    TECHNICAL = "technical"
    BUSINESS = "business"


class MessageStatus(StrEnum):
    RECEIVED = "received"
    IN_PROGRESS = "in_progress"
    RETRYING = "retrying"
    AWAITING_RECEIPT = "awaiting_receipt"
    DEFERRED = "deferred"
    STALLED = "stalled"
    DELIVERED = "delivered"
    NOT_ROUTED = "not_routed"
    REFUSED = "refused"
    CANCELLED = "cancelled"
    COLLECTION_ERROR = "collection_error"
    BUSINESS_ERROR = "business_error"
    ERROR = "error"


#: States a delivery never leaves by itself (only an operator action moves it on).
FINAL_STATES = frozenset({DeliveryState.DELIVERED, DeliveryState.FAILED,
                          DeliveryState.SKIPPED, DeliveryState.CANCELLED})

#: States from which a target may claim a delivery (when due).
CLAIMABLE_STATES = frozenset({DeliveryState.QUEUED, DeliveryState.RETRYING,
                              DeliveryState.STALLED})

#: States the sweep re-wakes on the wake-up schedule until claimed.
WAKEABLE_STATES = frozenset({DeliveryState.QUEUED, DeliveryState.RETRYING})

LABELS = {
    "received": "Received", "in_progress": "In progress", "retrying": "Retrying",
    "awaiting_receipt": "Awaiting receipt", "deferred": "Deferred", "stalled": "Stalled",
    "delivered": "Delivered", "not_routed": "Not routed", "refused": "Refused",
    "cancelled": "Cancelled", "collection_error": "Collection error",
    "business_error": "Business error", "error": "Error", "queued": "Queued",
    "failed": "Failed", "skipped": "Skipped",
}
