"""What a target reports about one delivery attempt.

A plugin returns an :class:`Outcome`; it never writes a status. The state machine
(:mod:`b2bhub.engine.machine.settlement`) turns the outcome into a transition, applying the
target's retry policy to errors. Plain Python: no Flask, no Celery.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum


@dataclass(frozen=True)
class Answer:
    """What a destination answered, for the target's business-error rules (SPEC 10).

    A target that talks to a service which answers (HTTP status and body) attaches it to
    its outcome; the core checks the instance's rules against it before the outcome is
    recorded, whatever the status said. ``body`` is the start of the answer's body (the
    target decides how much it reads; :data:`ANSWER_BODY_LIMIT` by default).
    """

    status: int | None
    body: bytes = b""
    content_type: str = ""
    headers: tuple[tuple[str, str], ...] = ()


#: how much of an answer's body a target keeps for the rules, at most
ANSWER_BODY_LIMIT = 1 << 20


class OutcomeKind(StrEnum):
    DELIVERED = "delivered"
    ERROR = "error"  # retried or failed by the retry policy, according to error_class
    RETRY = "retry"  # the plugin asks for a retry at a stated time
    AWAITING_RECEIPT = "awaiting_receipt"
    FAILED = "failed"  # permanent, technical
    BUSINESS_ERROR = "business_error"  # permanent, a business-error rule matched


@dataclass(frozen=True)
class Outcome:
    """The result of one attempt.

    ``error_class`` names what went wrong for the retry policy's rules: ``connection``,
    ``timeout``, ``http_5xx``, ``http_429``, ``http_<status>``, ``storage``, or an exception
    type name.
    """

    kind: OutcomeKind
    text: str = ""
    error_class: str | None = None
    retry_at: datetime | None = None
    receipt_ref: str | None = None
    receipt_deadline: datetime | None = None
    rule: str | None = None
    block: str | None = None  # business rule: None, "sequence" or "instance"
    data: dict = field(default_factory=dict)
    answer: Answer | None = None  # what the destination answered, for business rules

    def with_answer(self, answer: Answer | None) -> Outcome:
        """The same outcome carrying the destination's answer."""
        return replace(self, answer=answer)

    @classmethod
    def delivered(cls, text: str = "delivered", **data) -> Outcome:
        return cls(OutcomeKind.DELIVERED, text, data=data)

    @classmethod
    def error(cls, error_class: str, text: str, **data) -> Outcome:
        """A failure the retry policy decides about (retry later or fail)."""
        return cls(OutcomeKind.ERROR, text, error_class=error_class, data=data)

    @classmethod
    def retry(cls, text: str, at: datetime | None = None, **data) -> Outcome:
        return cls(OutcomeKind.RETRY, text, retry_at=at, data=data)

    @classmethod
    def awaiting_receipt(cls, ref: str, deadline: datetime | None = None, text: str = "",
                         **data) -> Outcome:
        return cls(OutcomeKind.AWAITING_RECEIPT, text or f"awaiting receipt {ref}",
                   receipt_ref=ref, receipt_deadline=deadline, data=data)

    @classmethod
    def failed(cls, text: str, **data) -> Outcome:
        """A failure no retry can mend (missing stage, file exists, bad pattern)."""
        return cls(OutcomeKind.FAILED, text, data=data)

    @classmethod
    def business_error(cls, rule: str, text: str, block: str | None = None,
                       **data) -> Outcome:
        return cls(OutcomeKind.BUSINESS_ERROR, text, rule=rule, block=block, data=data)
