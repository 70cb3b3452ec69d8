"""Alerts, settings, connected processes, locks, users and API tokens."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.models.base import Base, BigId, utcnow


class Alert(Base):
    """An open alert is unique per (kind, subject); resolving it keeps the row."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_open", "kind", "subject", "resolved_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    kind: Mapped[str] = mapped_column(String(40))
    subject: Mapped[str] = mapped_column(String(200))  # e.g. message:12, instance:writer
    text: Mapped[str] = mapped_column(default="")
    message_id: Mapped[int | None] = mapped_column(BigId, default=None, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    acknowledged_at: Mapped[datetime | None] = mapped_column(default=None)
    acknowledged_by: Mapped[str | None] = mapped_column(String(128), default=None)
    resolved_at: Mapped[datetime | None] = mapped_column(default=None)
    #: when its opening, and its resolution, were handed to the notification channels
    #: (``b2bhub.engine.notifications``); None: not yet
    notified_at: Mapped[datetime | None] = mapped_column(default=None)
    resolve_notified_at: Mapped[datetime | None] = mapped_column(default=None)


class Setting(Base):
    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[object] = mapped_column(JSON, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Process(Base):
    """A connected web, worker or beat process (System > Services)."""

    __tablename__ = "processes"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column()
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    instances: Mapped[list] = mapped_column(default=list)
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
    #: the database time since which this process's heartbeats came without a gap
    steady_since: Mapped[datetime | None] = mapped_column(default=None)


class Lock(Base):
    """A named lease: the guards of the sweep and the probe tick on SQLite (where there
    are no advisory locks), ``scan:<instance>`` for each scheduled source (see
    ``b2bhub.engine.scans``) and ``probe:<instance>``, when a target is probed next
    (``b2bhub.engine.probes``)."""

    __tablename__ = "locks"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(128), default=None)
    until: Mapped[datetime | None] = mapped_column(default=None)


class User(Base):
    """A person who logs in to the UI or owns API tokens; the name is what history lines
    record as the operator. Only a KDF hash of the password is kept."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256))
    role: Mapped[str] = mapped_column(String(16), default="viewer")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    disabled_at: Mapped[datetime | None] = mapped_column(default=None)
    last_login_at: Mapped[datetime | None] = mapped_column(default=None)
    #: the UI's language the user chose (a locale of b2bhub.i18n.LANGUAGES); None: the
    #: browser's Accept-Language
    language: Mapped[str | None] = mapped_column(String(16), default=None)


class ApiToken(Base):
    """A bearer token. A token created for a user acts as that user (its history lines name
    the user) with the user's role; a token without a user acts under its own name."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), default=None, index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16), default="admin")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)


class LogRecord(Base):
    """A log record of a connected process at or above ``B2BHUB_LOG_STREAM_LEVEL``
    (the Logs page); kept to a bounded count by the periodic trim."""

    __tablename__ = "log_records"
    __table_args__ = (Index("ix_log_records_level_id", "level", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    level: Mapped[int] = mapped_column()  # logging's number: 20 info, 30 warning ...
    logger: Mapped[str] = mapped_column(String(200), default="")
    message: Mapped[str] = mapped_column(default="")
    process_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column()


class StatsMinute(Base):
    """One minute of the dashboard's series, written by the periodic sampler once the
    minute is over: messages in, attempts and their outcomes, attempt durations, and
    the due deliveries as the sampler saw them."""

    __tablename__ = "stats_minutes"

    minute: Mapped[datetime] = mapped_column(primary_key=True)
    messages_in: Mapped[int] = mapped_column(default=0)
    attempts: Mapped[int] = mapped_column(default=0)
    delivered: Mapped[int] = mapped_column(default=0)
    failures: Mapped[int] = mapped_column(default=0)  # failed or retrying attempts
    duration_avg: Mapped[float | None] = mapped_column(default=None)  # seconds
    duration_max: Mapped[float | None] = mapped_column(default=None)
    due: Mapped[int] = mapped_column(default=0)
    oldest_due_seconds: Mapped[float | None] = mapped_column(default=None)


class ScorecardDay(Base):
    """A partner's figures of one day (UTC) for one direction, source and target, as
    ``b2bhub.domain.scorecard.Figures.as_dict`` (``b2bhub.services.scorecard``): the
    messages created that day and how their deliveries, receipts and acknowledgments
    ended. Written once the day's outcomes have settled; a scorecard adds up its days."""

    __tablename__ = "scorecard_days"

    partner: Mapped[str] = mapped_column(String(64), primary_key=True)
    day: Mapped[datetime] = mapped_column(primary_key=True)
    direction: Mapped[str] = mapped_column(String(16), primary_key=True)
    source: Mapped[str] = mapped_column(String(64), primary_key=True)
    target: Mapped[str] = mapped_column(String(64), primary_key=True)
    figures: Mapped[dict] = mapped_column(JSON)


class CleanupRun(Base):
    """One run of the nightly cleanup (``b2bhub.engine.cleanup``), shown on System >
    Services. Its counts are written in the transaction of each batch they count, so a
    run that was killed still says exactly what it removed. ``state``: running,
    finished, failed, or interrupted (its process died; found so by the next run)."""

    __tablename__ = "cleanup_runs"
    __table_args__ = (Index("ix_cleanup_runs_started_at", "started_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    state: Mapped[str] = mapped_column(String(16), default="running")
    trigger: Mapped[str] = mapped_column(String(16), default="schedule")  # schedule | manual
    owner: Mapped[str] = mapped_column(String(128), default="")
    messages_removed: Mapped[int] = mapped_column(BigId, default=0)
    bytes_removed: Mapped[int] = mapped_column(BigId, default=0)
    files_removed: Mapped[int] = mapped_column(BigId, default=0)
    error: Mapped[str] = mapped_column(Text, default="")
    # the payload store as the run's walk left it: files and bytes on disk, and the
    # distinct files the rows reference (the storage report shows the difference)
    store_files: Mapped[int | None] = mapped_column(BigId, default=None)
    store_bytes: Mapped[int | None] = mapped_column(BigId, default=None)
    referenced_files: Mapped[int | None] = mapped_column(BigId, default=None)
    referenced_bytes: Mapped[int | None] = mapped_column(BigId, default=None)
