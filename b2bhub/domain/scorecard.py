"""A partner's scorecard as arithmetic (docs/scorecard.md): how a delivery, a receipt
and an acknowledgment count, the fixed buckets of the time from receipt to delivery,
and percentiles read from those buckets. Plain Python: the services feed it rows and
store its :class:`Figures` (a day's figures are kept, then added up for a period).

A percentile read from buckets is the upper bound of the bucket holding the rank: the
true value lies in that bucket, so it is exact to the bucket's width (one bound below
it at most) and never under-states a delay."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field, fields

#: upper bounds, in seconds, of the buckets of the time from receipt to delivery; a last
#: bucket holds what took longer than a day
BOUNDS: tuple[float, ...] = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200,
                             21600, 86400)
#: the periods a scorecard covers, in days (today and the days before it)
PERIODS = (7, 30, 90)
#: how a delivery failed by the sweep for want of a receipt starts its ``last_result``
#: (``b2bhub.engine.machine.receipts.fail_overdue_receipts``)
NO_RECEIPT = "no receipt within"

#: a settled outcome's column; None: still on its way (or skipped, cancelled)
FIRST_TIME, AFTER_RETRIES = "first_time", "after_retries"
FAILED_TECHNICAL, FAILED_BUSINESS, PENDING = "failed_technical", "failed_business", "pending"
#: a receipt's or an acknowledgment's column
ON_TIME, LATE, MISSING, WAITING = "on_time", "late", "missing", "waiting"


def bucket(seconds: float) -> int:
    """The index of the bucket of a duration (a bound belongs to its own bucket)."""
    return bisect_left(BOUNDS, max(seconds, 0.0))


def outcome(state: str, failure_kind: str | None, attempt: int) -> str | None:
    """The column a delivery counts in: delivered at its first attempt or after more,
    failed (technical or business), pending while on its way; None when an operator
    skipped or cancelled it (it is no outcome of the partner's)."""
    if state == "delivered":
        return FIRST_TIME if attempt <= 1 else AFTER_RETRIES
    if state == "failed":
        return FAILED_BUSINESS if failure_kind == "business" else FAILED_TECHNICAL
    if state in ("skipped", "cancelled"):
        return None
    return PENDING


def receipt(state: str, receipt_ref: str | None, last_result: str,
            refused_after: bool) -> str | None:
    """The column of a delivery's receipt (one its target's protocol returns, or a
    callback reported through the API): None when it waited for none; waiting while it
    still does; missing when the deadline failed the delivery, late when a receipt then
    came after all (it was refused as unattributable); on time when one settled it
    (positive or negative)."""
    if receipt_ref is None:
        return None
    if state == "awaiting_receipt":
        return WAITING
    if state == "failed" and last_result.startswith(NO_RECEIPT):
        return LATE if refused_after else MISSING
    return ON_TIME


def acknowledgment(state: str, overdue: bool) -> str:
    """The column of an EDI acknowledgment we wait for (``edi_ack_waits``): settled in
    time, settled after it was found overdue (late), overdue and still awaited
    (missing), or still within its hours (waiting)."""
    if state == "awaiting":
        return MISSING if overdue else WAITING
    return LATE if overdue else ON_TIME


def percentile(counts: list[int], q: float) -> float | None:
    """The ``q`` (0..1) percentile of the durations the bucket ``counts`` hold: the upper
    bound of the bucket of the nearest rank (``ceil(q * n)``); None when there are none,
    ``inf`` when it lies in the last bucket (over a day)."""
    total = sum(counts)
    if not total:
        return None
    rank = max(1, -(-int(q * total * 1000) // 1000))  # ceil, without float noise
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return BOUNDS[index] if index < len(BOUNDS) else float("inf")
    return float("inf")  # pragma: no cover - the counts add up to total


def _zeros() -> list[int]:
    return [0] * (len(BOUNDS) + 1)


@dataclass
class Figures:
    """The counts of one key (direction, source, target) over a day or a period."""

    messages: int = 0
    bytes: int = 0
    first_time: int = 0
    after_retries: int = 0
    failed_technical: int = 0
    failed_business: int = 0
    pending: int = 0
    receipts: dict = field(default_factory=lambda: dict.fromkeys(
        (ON_TIME, LATE, MISSING, WAITING), 0))
    acks: dict = field(default_factory=lambda: dict.fromkeys(
        (ON_TIME, LATE, MISSING, WAITING), 0))
    durations: list = field(default_factory=_zeros)

    def count_message(self, size: int) -> None:
        self.messages += 1
        self.bytes += size or 0

    def count_delivery(self, column: str | None, seconds: float | None) -> None:
        """Count an outcome (:func:`outcome`) and, when delivered, its time from the
        message's receipt."""
        if column is None:
            return
        setattr(self, column, getattr(self, column) + 1)
        if column in (FIRST_TIME, AFTER_RETRIES) and seconds is not None:
            self.durations[bucket(seconds)] += 1

    def add(self, other: Figures) -> Figures:
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):
                for key, value in theirs.items():
                    mine[key] = mine.get(key, 0) + value
            elif isinstance(mine, list):
                for index, value in enumerate(theirs):
                    mine[index] += value
            else:
                setattr(self, f.name, mine + theirs)
        return self

    @property
    def delivered(self) -> int:
        return self.first_time + self.after_retries

    @property
    def median_seconds(self) -> float | None:
        return percentile(self.durations, 0.5)

    @property
    def p95_seconds(self) -> float | None:
        return percentile(self.durations, 0.95)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def of(cls, stored: dict) -> Figures:
        """The figures a stored :meth:`as_dict` holds (a key it lacks counts zero)."""
        return cls().add(cls(**{f.name: stored[f.name] for f in fields(cls)
                                if f.name in stored}))
