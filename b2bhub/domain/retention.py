"""Retention (SPEC 13): how long a source instance's messages are kept once final.

A source instance's ``retention_days``: a number of days; ``None`` or ``0``: the
``retention_days`` setting (System > Settings); :data:`KEEP_FOREVER` (``-1``): its
messages are never removed by the cleanup. Only messages in a final status are ever
removed, and never one with a delivery still open. Plain Python.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from b2bhub.domain.states import FINAL_STATES, DeliveryState, MessageStatus

KEEP_FOREVER = -1

#: statuses a message never leaves by itself: the only ones the cleanup removes
FINAL_STATUSES = frozenset({
    MessageStatus.DELIVERED, MessageStatus.CANCELLED, MessageStatus.REFUSED,
    MessageStatus.ERROR, MessageStatus.BUSINESS_ERROR, MessageStatus.COLLECTION_ERROR,
    MessageStatus.NOT_ROUTED})

#: delivery states that keep their message however old it is
OPEN_STATES = frozenset(set(DeliveryState) - FINAL_STATES)


def effective_days(instance_days: int | None, default_days: int) -> int | None:
    """The days a source's messages are kept; None: forever."""
    if instance_days == KEEP_FOREVER:
        return None
    if not instance_days:
        return default_days
    return instance_days


def describe(instance_days: int | None, default_days: int) -> str:
    """How a source's retention reads on a page: "30 days (default)", "forever"."""
    days = effective_days(instance_days, default_days)
    if days is None:
        return "forever"
    return f"{days} days" + (" (default)" if not instance_days else "")


def cutoff(now: datetime, days: int | None) -> datetime | None:
    """Messages created before this moment are past retention; None: none ever is."""
    return None if days is None else now - timedelta(days=days)


class BatchSizer:
    """How many messages the cleanup deletes in one transaction, sized to a time budget.

    A deleting transaction holds its rows' locks until it commits, and what it costs per
    message depends on the machine and on the work beside it (an intake writing at the
    same time, a disk shared with other writers). A fixed size is too big on a busy
    night and too small on a quiet one, so the size follows what each full batch took:
    over ``budget`` seconds the next is cut in proportion (with a margin), under half
    of it the next grows by a quarter, between ``smallest`` and ``largest``. A short
    batch (the last of a run) says nothing of the size and changes nothing."""

    def __init__(self, size: int = 500, budget: float | None = 0.1, smallest: int = 1,
                 largest: int = 5000):
        self.budget, self.smallest, self.largest = budget, max(1, smallest), largest
        self.size = min(max(size, self.smallest), largest)

    def record(self, rows: int, seconds: float) -> None:
        if self.budget is None or rows < self.size or seconds <= 0:
            return  # (no budget: the size is fixed)
        if seconds > self.budget:
            self.size = max(self.smallest, int(self.size * self.budget / seconds * 0.8))
        elif seconds < self.budget / 2:
            self.size = min(self.largest, self.size + max(1, self.size // 4))
