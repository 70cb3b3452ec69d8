"""The acknowledgment loop for interchanges we send (docs/edi.md, "Acknowledgments we
receive"): a wait per group or interchange a partner is to acknowledge, and a row per
acknowledgment received until a worker has matched it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, String, text
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.models.base import Base, BigId

#: the states of a wait
AWAITING, ACKNOWLEDGED, REJECTED = "awaiting", "acknowledged", "rejected"


class AckWait(Base):
    """An outbound message's group (X12: GS06) or interchange (EDIFACT: UNB 0020) that
    its partner is to acknowledge within its ``ack_hours``. ``due_at`` is set while the
    wait is awaiting and not yet found overdue (the overdue scan reads only those);
    ``overdue`` once it was."""

    __tablename__ = "edi_ack_waits"
    __table_args__ = (
        Index("ix_edi_ack_waits_key", "partner_identity", "control"),
        Index("ix_edi_ack_waits_due", "due_at", postgresql_where=text("due_at IS NOT NULL"),
              sqlite_where=text("due_at IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    message_id: Mapped[int] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    partner: Mapped[str] = mapped_column(String(64))
    standard: Mapped[str] = mapped_column(String(16))
    #: our sender identity and the partner's, ``qualifier:id``, as the envelope has them
    our_identity: Mapped[str] = mapped_column(String(64))
    partner_identity: Mapped[str] = mapped_column(String(64))
    interchange_control: Mapped[str] = mapped_column(String(35))
    #: what an acknowledgment names: X12 the group's GS06, EDIFACT the UNB 0020
    control: Mapped[str] = mapped_column(String(35))
    functional_id: Mapped[str] = mapped_column(String(8))  # X12 GS01; "" for EDIFACT
    state: Mapped[str] = mapped_column(String(16))
    due_at: Mapped[datetime | None] = mapped_column(nullable=True)
    overdue: Mapped[bool] = mapped_column(Boolean)
    ack_message_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    result: Mapped[str] = mapped_column(String(32))  # accepted, rejected, ...
    codes: Mapped[list] = mapped_column()
    created_at: Mapped[datetime] = mapped_column()
    settled_at: Mapped[datetime | None] = mapped_column(nullable=True)


class AckReceived(Base):
    """An acknowledgment received (a message whose envelope acknowledges something),
    written with its message; ``due_at`` is set until a worker matched it to the waits
    it settles (``state`` pending, then matched or unmatched)."""

    __tablename__ = "edi_acks_received"
    __table_args__ = (
        Index("ix_edi_acks_received_due", "due_at",
              postgresql_where=text("due_at IS NOT NULL"),
              sqlite_where=text("due_at IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    message_id: Mapped[int] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    standard: Mapped[str] = mapped_column(String(16))
    sender: Mapped[str] = mapped_column(String(64))  # the ack's envelope sender
    receiver: Mapped[str] = mapped_column(String(64))
    #: ``Envelope.acknowledges`` as the inspector read it
    acknowledges: Mapped[list] = mapped_column()
    state: Mapped[str] = mapped_column(String(16))
    due_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column()
