"""Messages, their payload stages, deliveries and history (SPEC 11)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, SmallInteger, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from b2bhub.models.base import Base, BigId, utcnow


def _set(name: str, *columns: str) -> Index:
    """An index of the rows whose last column is set (migration 0023): a row version
    with it NULL (most deliveries, once claimed; most messages) adds no entry to it,
    and every query that reads it compares that column, which implies it is set."""
    where = text(f"{columns[-1]} IS NOT NULL")
    return Index(name, *columns, postgresql_where=where, sqlite_where=where)


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (
        Index("ix_messages_status_id", "status", "id"),
        Index("ix_messages_created_at_id", "created_at", "id"),
        Index("ix_messages_source_external", "source", "external_id"),
        Index("ix_messages_from_party_id", "from_party", "id"),
        Index("ix_messages_to_party_id", "to_party", "id"),
        _set("ix_messages_correlation_id", "correlation_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    source: Mapped[str] = mapped_column(String(64))
    from_party: Mapped[str] = mapped_column(String(64))
    to_party: Mapped[str] = mapped_column(String(64))
    direction: Mapped[str] = mapped_column(String(16))  # inbound | outbound | internal
    original_filename: Mapped[str | None] = mapped_column(String(255), default=None)
    external_id: Mapped[str | None] = mapped_column(String(255), default=None)
    correlation_id: Mapped[str | None] = mapped_column(String(255), default=None)
    sequence_key: Mapped[str | None] = mapped_column(String(200), default=None)
    #: the W3C traceparent of the span that stored it, when tracing was on
    trace_parent: Mapped[str | None] = mapped_column(String(55), default=None)
    size: Mapped[int] = mapped_column(default=0)
    sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    status: Mapped[str] = mapped_column(String(24))
    status_text: Mapped[str] = mapped_column(default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    deliveries: Mapped[list[Delivery]] = relationship(
        back_populates="message", order_by="Delivery.id", cascade="all, delete-orphan",
        passive_deletes=True)
    payloads: Mapped[list[Payload]] = relationship(
        order_by="Payload.id", cascade="all, delete-orphan", passive_deletes=True)


class Payload(Base):
    """One recorded stage of a message: raw, unpacked, sent or receipt."""

    __tablename__ = "payloads"
    __table_args__ = (UniqueConstraint("message_id", "stage"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"))
    stage: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64), index=True)
    size: Mapped[int] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


CLAIMABLE = text("state IN ('queued', 'retrying', 'stalled')")


class Delivery(Base):
    """One message on its way to one target; only ``b2bhub.engine.machine`` writes state.

    ``attempt`` grows with every claim and fences every settlement; ``failures`` counts
    the failed attempts the retry policy has seen since the last operator action.
    ``due_at`` is when it may be claimed, ``next_wake_at`` when the sweep wakes it next.
    """

    __tablename__ = "deliveries"
    __table_args__ = (
        Index("ix_deliveries_state_due", "state", "due_at"),
        _set("ix_deliveries_state_wake", "state", "next_wake_at"),
        _set("ix_deliveries_state_lease", "state", "lease_until"),
        _set("ix_deliveries_state_receipt", "state", "receipt_deadline"),
        Index("ix_deliveries_target_state", "target", "state", "due_at"),
        Index("ix_deliveries_sequence", "target", "sequence_key", "id"),
        # the claim's order over the claimable rows only (migration 0007)
        Index("ix_deliveries_claimable", "target", "due_at", "id",
              postgresql_where=CLAIMABLE, sqlite_where=CLAIMABLE),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    message_id: Mapped[int] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    target: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(24))
    failure_kind: Mapped[str | None] = mapped_column(String(16), default=None)
    attempt: Mapped[int] = mapped_column(default=0)
    failures: Mapped[int] = mapped_column(default=0)
    due_at: Mapped[datetime | None] = mapped_column(default=None)
    next_wake_at: Mapped[datetime | None] = mapped_column(default=None)
    wake_count: Mapped[int] = mapped_column(default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(128), default=None)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    receipt_ref: Mapped[str | None] = mapped_column(String(255), default=None)
    receipt_deadline: Mapped[datetime | None] = mapped_column(default=None)
    sequence_key: Mapped[str | None] = mapped_column(String(200), default=None)
    last_result: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    settled_at: Mapped[datetime | None] = mapped_column(default=None)
    #: the lane of its target's Max Concurrent Deliveries its last claim counted in
    #: (``b2bhub.engine.machine.lanes``, PostgreSQL); NULL counts as lane 0
    lane: Mapped[int | None] = mapped_column(SmallInteger, default=None)

    message: Mapped[Message] = relationship(back_populates="deliveries")


class HistoryLine(Base):
    """A line of a message's history; its id is the SSE event id. Never guarded.

    ``message_id`` names its message without a foreign key (as ``delivery_id`` names
    its delivery): lines are only ever written by the engine in the transaction that
    reads or writes the message's rows, and they go with their message in the
    cleanup's own statement (:func:`b2bhub.engine.cleanup._delete_batch`). On
    PostgreSQL a foreign key is a check per inserted row (6 us cached, 20 planned each
    time, as every execution then was): a settled batch writes 64 lines, and their
    checks were a fifth of a drain's time (migration 0021)."""

    __tablename__ = "history"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    message_id: Mapped[int | None] = mapped_column(BigId, index=True, default=None)
    delivery_id: Mapped[int | None] = mapped_column(BigId, default=None)
    type: Mapped[str] = mapped_column(String(40))
    actor: Mapped[str] = mapped_column(String(128), default="")
    text: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
