"""Expected-message rules and the record of their windows (docs/expected-messages.md)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.models.base import Base, BigId, utcnow

#: a window's states: open until judged; met (a message in time), missed (none by
#: its end, ``expected_missing`` raised), late (missed, then a message came)
OPEN, MET, MISSED, LATE = "open", "met", "missed", "late"


class ExpectedRule(Base):
    """A message the hub expects: its criteria and its window (a cron ``schedule`` in
    ``timezone``, or ``after`` (a trigger's criteria) and ``within_minutes``).
    ``planned_until``: the end of the last schedule window written for it."""

    __tablename__ = "expected_rules"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(String(255), default="")
    direction: Mapped[str] = mapped_column(String(16), default="*")
    from_party: Mapped[str] = mapped_column(String(64), default="*")
    to_party: Mapped[str] = mapped_column(String(64), default="*")
    source: Mapped[str] = mapped_column(String(64), default="")
    target: Mapped[str] = mapped_column(String(64), default="")
    filename: Mapped[str] = mapped_column(String(255), default="*")
    document_type: Mapped[str] = mapped_column(String(35), default="*")
    schedule: Mapped[str | None] = mapped_column(String(100), default=None)
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    opens_minutes: Mapped[int | None] = mapped_column(default=None)
    after: Mapped[dict | None] = mapped_column(JSON, default=None)
    within_minutes: Mapped[int | None] = mapped_column(default=None)
    enabled: Mapped[bool] = mapped_column(default=True)
    planned_until: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str] = mapped_column(String(128), default="")


class ExpectedWindow(Base):
    """One window of a rule, judged once: unique by (rule, key), the key the window's
    end (a schedule) or its trigger message (a relation). Open windows are found by
    (state, ends_at); a rule's last ones by (rule_id, ends_at)."""

    __tablename__ = "expected_windows"
    __table_args__ = (UniqueConstraint("rule_id", "key"),
                      Index("ix_expected_windows_state_ends", "state", "ends_at"),
                      Index("ix_expected_windows_rule_ends", "rule_id", "ends_at"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    rule_id: Mapped[int] = mapped_column(ForeignKey("expected_rules.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(40))
    starts_at: Mapped[datetime] = mapped_column()
    ends_at: Mapped[datetime] = mapped_column()
    state: Mapped[str] = mapped_column(String(16), default=OPEN)
    #: a relation's: the request, and the parties its response goes between
    trigger_message_id: Mapped[int | None] = mapped_column(BigId, default=None)
    from_party: Mapped[str] = mapped_column(String(64), default="*")
    to_party: Mapped[str] = mapped_column(String(64), default="*")
    message_id: Mapped[int | None] = mapped_column(BigId, default=None)
    arrived_at: Mapped[datetime | None] = mapped_column(default=None)
    judged_at: Mapped[datetime | None] = mapped_column(default=None)
