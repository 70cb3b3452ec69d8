"""What a document inspector read of a message's envelope (docs/edi.md)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.models.base import Base, BigId


class MessageAttribute(Base):
    """One distinct (name, value) of a message's envelope: ``standard``, ``version``,
    ``sender`` / ``receiver`` (``qualifier:id``), ``interchange_control``,
    ``interchange_date``, ``groups`` / ``sets`` (counts), ``group_type``,
    ``group_control``, ``document_type``, ``transaction_control``, ``reference`` and
    ``edi_error``. Found by name and value (the messages' filters), and a message's by
    its id and name (``ix_message_attributes_message_name``: a plan that reads one
    message's sender is then the only one that matches the index whole)."""

    __tablename__ = "message_attributes"
    __table_args__ = (Index("ix_message_attributes_name_value", "name", "value"),
                      Index("ix_message_attributes_message_name", "message_id", "name"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    message_id: Mapped[int] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(32))
    value: Mapped[str] = mapped_column(String(255))


class AckJob(Base):
    """A received interchange whose functional acknowledgment is still to be made
    (docs/edi.md), written with the message when the inspection found an envelope to
    acknowledge; due when ``due_at`` is empty or past. A worker takes it by setting
    ``claimed_by`` and moving ``due_at`` a lease ahead (one UPDATE only one wins), and
    makes the acknowledgment and deletes the row in one transaction fenced by
    ``claimed_by``: a worker killed in between leaves it to be taken again after the
    lease."""

    __tablename__ = "edi_ack_jobs"

    message_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("messages.id", ondelete="CASCADE"), primary_key=True)
    due_at: Mapped[datetime | None] = mapped_column(default=None, index=True)
    claimed_by: Mapped[str | None] = mapped_column(String(80), default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_error: Mapped[str] = mapped_column(String(500), default="", server_default="")


class AckNumber(Base):
    """The last control number of our functional acknowledgments to a partner in a
    standard (``X12``, ``EDIFACT``): the next is taken by one UPDATE of this row in the
    transaction that stores the acknowledgment, so two are never the same."""

    __tablename__ = "edi_ack_numbers"

    party_id: Mapped[int] = mapped_column(
        ForeignKey("parties.id", ondelete="CASCADE"), primary_key=True)
    standard: Mapped[str] = mapped_column(String(16), primary_key=True)
    last_number: Mapped[int] = mapped_column(BigInteger)
