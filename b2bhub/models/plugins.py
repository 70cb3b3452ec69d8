"""Plugin instances and routes (SPEC 3, 4)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.models.base import Base, utcnow


class InstanceState:
    DISABLED = "disabled"
    ENABLED = "enabled"  # enabled, not yet started by any process
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"


class PluginInstance(Base):
    __tablename__ = "plugin_instances"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    type: Mapped[str] = mapped_column(String(64), index=True)
    enabled: Mapped[bool] = mapped_column(default=True)
    config: Mapped[dict] = mapped_column(default=dict)
    max_concurrent_deliveries: Mapped[int] = mapped_column(default=4)
    retry_policy: Mapped[dict | None] = mapped_column(default=None)
    # business-error rules (b2bhub.domain.business_rules), a list of rule objects
    business_rules: Mapped[list | None] = mapped_column(default=None)
    # the delivery whose business error blocks the whole instance (None: not blocked)
    blocked_by_delivery_id: Mapped[int | None] = mapped_column(BigInteger, default=None)
    ordered: Mapped[bool] = mapped_column(default=False)
    queue: Mapped[str | None] = mapped_column(String(64), default=None)
    # seconds between probes of a target whose type has one; 0: the System > Settings
    # ``probe_interval`` (b2bhub.engine.probes)
    probe_interval: Mapped[int] = mapped_column(default=0)
    # the last probe's result: True online, False offline, None never probed or no probe
    online: Mapped[bool | None] = mapped_column(default=None)
    probe_checked_at: Mapped[datetime | None] = mapped_column(default=None)
    probe_text: Mapped[str | None] = mapped_column(default=None)
    retention_days: Mapped[int | None] = mapped_column(default=None)
    # a source's from and to: "source" (its path or configuration decides) or "envelope"
    # (the EDI identities of the envelope's sender and receiver, docs/edi.md)
    parties_from: Mapped[str] = mapped_column(String(16), default="source",
                                              server_default="source")
    # a source's checks of envelopes at intake (docs/edi.md "Checks at intake"): an
    # interchange with envelope errors is delivered ("accept") or Refused ("refuse"); one
    # whose sender and interchange control number came within ``duplicate_days`` (0: no
    # check) is delivered with an alert ("alert") or Refused ("refuse")
    edi_errors: Mapped[str] = mapped_column(String(16), default="accept",
                                            server_default="accept")
    duplicates: Mapped[str] = mapped_column(String(16), default="alert",
                                            server_default="alert")
    duplicate_days: Mapped[int] = mapped_column(default=30, server_default="30")
    state: Mapped[str] = mapped_column(String(16), default=InstanceState.ENABLED)
    state_reason: Mapped[str] = mapped_column(default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Route(Base):
    __tablename__ = "routes"
    __table_args__ = (Index("ix_routes_source_target", "source", "target"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    source: Mapped[str] = mapped_column(
        String(64), ForeignKey("plugin_instances.name", ondelete="RESTRICT"))
    from_party: Mapped[str] = mapped_column(String(64))  # a party name or "*"
    to_party: Mapped[str] = mapped_column(String(64))
    #: a document type (850, ORDERS) the message's envelope must hold, or "*" (any)
    document_type: Mapped[str] = mapped_column(String(35), default="*", server_default="*")
    target: Mapped[str] = mapped_column(
        String(64), ForeignKey("plugin_instances.name", ondelete="RESTRICT"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str] = mapped_column(String(100), default="")
