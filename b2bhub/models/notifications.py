"""Alert notifications (SPEC 14): the channels alerts are sent to, and one row per
notification to send, with its due time and attempts (see
:mod:`b2bhub.engine.notifications`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.models.base import Base, BigId, utcnow


class NotificationChannel(Base):
    """Where alerts go: an Apprise URL (``mailto://``, ``json://``, ``slack://`` ...)."""

    __tablename__ = "notification_channels"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    url: Mapped[str] = mapped_column()
    #: the alert kinds sent here; empty: every kind
    kinds: Mapped[list] = mapped_column(default=list)
    #: also send a notification when an alert resolves
    on_resolve: Mapped[bool] = mapped_column(default=False)
    enabled: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str] = mapped_column(String(128), default="")


class Notification(Base):
    """One notification to one channel: about one alert, a digest of several, or a
    test. Sent at most once when its send was recorded; retried while pending."""

    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_state_due", "state", "due_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    channel_id: Mapped[int] = mapped_column(
        ForeignKey("notification_channels.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(String(16))  # opened | resolved | digest | test
    alert_ids: Mapped[list] = mapped_column(default=list)
    title: Mapped[str] = mapped_column(default="")
    body: Mapped[str] = mapped_column(default="")
    state: Mapped[str] = mapped_column(String(16), default="pending")  # pending|sent|failed
    attempts: Mapped[int] = mapped_column(default=0)
    due_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    sent_at: Mapped[datetime | None] = mapped_column(default=None)
    last_error: Mapped[str] = mapped_column(default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
