"""AS2 bookkeeping beside the messages (SPEC 9): what came in, what went out.

``as2_inbound``: one row per AS2 message received (accepted or refused). An accepted one
holds ``accepted_key`` (partner and AS2 Message-ID), unique, so a repeat of the same
Message-ID from the same partner finds the message and the receipt already given; a
refused one leaves it empty, so a partner may send the mended message again under the
same Message-ID. An asynchronous MDN owed to the partner is a due row here (``mdn_state``
pending, ``mdn_due_at``), sent by a worker and retried from the row, not from memory.

``as2_outbound``: one row per (message, target) sent by an ``as2_sender``: the AS2
Message-ID (Send again repeats it) and the MIC the partner's MDN must confirm.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.plugin import Base, BigId, utcnow


class As2Inbound(Base):
    __tablename__ = "as2_inbound"
    __table_args__ = (Index("ix_as2_inbound_mdn_due", "mdn_state", "mdn_due_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    partner: Mapped[str] = mapped_column(String(64))
    as2_message_id: Mapped[str] = mapped_column(String(255))
    accepted_key: Mapped[str | None] = mapped_column(String(330), unique=True, default=None)
    message_id: Mapped[int | None] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True, default=None)
    mdn_digest: Mapped[str | None] = mapped_column(String(64), default=None)
    mdn_headers: Mapped[dict | None] = mapped_column(default=None)
    mdn_url: Mapped[str | None] = mapped_column(Text, default=None)
    # none | sync | pending | sent | failed
    mdn_state: Mapped[str] = mapped_column(String(16), default="none")
    mdn_due_at: Mapped[datetime | None] = mapped_column(default=None)
    mdn_attempts: Mapped[int] = mapped_column(default=0)
    mdn_last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class As2Outbound(Base):
    __tablename__ = "as2_outbound"
    __table_args__ = (UniqueConstraint("message_id", "target"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"))
    target: Mapped[str] = mapped_column(String(64))
    as2_message_id: Mapped[str] = mapped_column(String(255), unique=True)
    partner: Mapped[str] = mapped_column(String(64))
    mic: Mapped[str | None] = mapped_column(String(200), default=None)
    digest_alg: Mapped[str | None] = mapped_column(String(16), default=None)
    mdn_signed: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
