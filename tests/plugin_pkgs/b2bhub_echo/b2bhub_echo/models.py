"""The table of the echo protocol: one row per message it took (its own migration)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.plugin import Base, BigId, utcnow


class EchoReceipt(Base):
    __tablename__ = "echo_receipts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    message_id: Mapped[int] = mapped_column(BigId, ForeignKey("messages.id",
                                                              ondelete="CASCADE"))
    echo_id: Mapped[str] = mapped_column(String(100))
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    tallied_at: Mapped[datetime | None] = mapped_column(default=None)
