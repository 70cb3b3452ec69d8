"""Organizations, partners and their protocol profiles (SPEC 2)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from b2bhub.models.base import Base, utcnow

ORGANIZATION = "organization"
PARTNER = "partner"


class Party(Base):
    __tablename__ = "parties"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16), index=True)  # organization | partner
    display_name: Mapped[str] = mapped_column(String(200), default="")
    #: the functional acknowledgment this partner gets for each interchange it sends us
    #: (docs/edi.md): none, 997 or 999 for X12; any but none: a CONTRL for EDIFACT
    functional_acks: Mapped[str] = mapped_column(String(8), default="none",
                                                 server_default="none")
    #: hours within which this partner acknowledges an interchange we send it; None: we
    #: expect no acknowledgment (no ``ack_overdue``)
    ack_hours: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    profiles: Mapped[list[ProtocolProfile]] = relationship(
        back_populates="party", cascade="all, delete-orphan")
    identities: Mapped[list[PartyIdentity]] = relationship(
        back_populates="party", cascade="all, delete-orphan",
        order_by="PartyIdentity.id")

    @property
    def edi_identities(self) -> list[str]:
        """The party's EDI identities as ``qualifier:id``, in the order they were given."""
        return [f"{i.qualifier}:{i.identifier}" for i in self.identities]


class PartyIdentity(Base):
    """One way a party is named in an envelope (docs/edi.md): X12 ISA05/ISA06 or ISA07/
    ISA08, EDIFACT UNB S002/S003. An identity belongs to one party at most."""

    __tablename__ = "party_identities"
    __table_args__ = (UniqueConstraint("qualifier", "identifier"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    party_id: Mapped[int] = mapped_column(
        ForeignKey("parties.id", ondelete="CASCADE"), index=True)
    qualifier: Mapped[str] = mapped_column(String(4))
    identifier: Mapped[str] = mapped_column(String(35))

    party: Mapped[Party] = relationship(back_populates="identities")


class ProtocolProfile(Base):
    """At most one profile per protocol per party; the protocol plugin owns ``settings``."""

    __tablename__ = "protocol_profiles"
    __table_args__ = (UniqueConstraint("party_id", "protocol"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    party_id: Mapped[int] = mapped_column(ForeignKey("parties.id", ondelete="CASCADE"))
    protocol: Mapped[str] = mapped_column(String(32))
    address: Mapped[str] = mapped_column(String(200), index=True)  # e.g. the AS2 ID
    settings: Mapped[dict] = mapped_column(default=dict)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    party: Mapped[Party] = relationship(back_populates="profiles")
    certificates: Mapped[list[Certificate]] = relationship(
        back_populates="profile", cascade="all, delete-orphan")


class Certificate(Base):
    __tablename__ = "certificates"

    id: Mapped[int] = mapped_column(primary_key=True)
    profile_id: Mapped[int] = mapped_column(
        ForeignKey("protocol_profiles.id", ondelete="CASCADE"), index=True)
    usage: Mapped[str] = mapped_column(String(32))  # signing | encryption | tls
    pem: Mapped[str] = mapped_column()
    private_key_pem: Mapped[str | None] = mapped_column(default=None)
    subject: Mapped[str] = mapped_column(String(500), default="")
    issuer: Mapped[str] = mapped_column(String(500), default="")
    not_before: Mapped[datetime | None] = mapped_column(default=None)
    not_after: Mapped[datetime | None] = mapped_column(default=None, index=True)

    profile: Mapped[ProtocolProfile] = relationship(back_populates="certificates")
