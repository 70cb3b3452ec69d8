"""What a document inspector read of a message's envelope (docs/edi.md)."""

from __future__ import annotations

from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.models.base import Base, BigId


class MessageAttribute(Base):
    """One distinct (name, value) of a message's envelope: ``standard``, ``version``,
    ``sender`` / ``receiver`` (``qualifier:id``), ``interchange_control``,
    ``interchange_date``, ``groups`` / ``sets`` (counts), ``group_type``,
    ``group_control``, ``document_type``, ``transaction_control``, ``reference`` and
    ``edi_error``. Found by name and value (the messages' filters)."""

    __tablename__ = "message_attributes"
    __table_args__ = (Index("ix_message_attributes_name_value", "name", "value"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    message_id: Mapped[int] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(32))
    value: Mapped[str] = mapped_column(String(255))
