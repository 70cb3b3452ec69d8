"""The core's rows as a plugin reads and writes them, offered through
:mod:`b2bhub.plugin`: a plugin calls these functions and gets plain values back; it
never queries the core's tables (``plugin_instances``, ``parties``,
``protocol_profiles``, ``certificates``, ``messages``, ``payloads``, ``deliveries``,
``history``) itself.

Each function works on the session it is given and leaves the commit to its caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.models import (
    Certificate,
    Delivery,
    HistoryLine,
    Message,
    Party,
    Payload,
    PluginInstance,
    ProtocolProfile,
)
from b2bhub.services.config import no_party, no_profile
from b2bhub.services.errors import NotFound

# --- plugin instances -------------------------------------------------------------------


def instance_type(session: Session, name: str) -> str | None:
    """The plugin type of the instance named ``name``; None when there is none."""
    return session.scalar(select(PluginInstance.type).where(PluginInstance.name == name))


# --- messages, their stages, deliveries and history -------------------------------------

@dataclass(frozen=True)
class MessageView:
    """What a plugin may read of a stored message."""

    id: int
    source: str
    from_party: str
    to_party: str
    status: str
    external_id: str | None
    correlation_id: str | None


def message_view(session: Session, message_id: int) -> MessageView | None:
    """The message ``message_id`` (None when there is none), in one statement."""
    row = session.execute(select(
        Message.id, Message.source, Message.from_party, Message.to_party, Message.status,
        Message.external_id, Message.correlation_id).where(Message.id == message_id)).first()
    return None if row is None else MessageView(*row)


def record_stage(session: Session, message_id: int, stage: str, stored: Any,
                 now: datetime) -> None:
    """Record a payload stage of a message after its intake (``stored``: its
    ``digest`` and ``size``, a :class:`b2bhub.payloads.store.StoredPayload`), or replace
    the one recorded under that name (a Send again, a later receipt)."""
    row = session.scalar(select(Payload).where(Payload.message_id == message_id,
                                               Payload.stage == stage))
    if row is None:
        session.add(Payload(message_id=message_id, stage=stage, digest=stored.digest,
                            size=stored.size, created_at=now))
    else:
        row.digest, row.size, row.created_at = stored.digest, stored.size, now


@dataclass(frozen=True)
class DeliveryView:
    """A delivery's id and state (a :class:`b2bhub.domain.states.DeliveryState`)."""

    id: int
    state: Any


def delivery_of(session: Session, message_id: int, target: str) -> DeliveryView | None:
    """The message's delivery to ``target``, None when it has none."""
    row = session.execute(select(Delivery.id, Delivery.state).where(
        Delivery.message_id == message_id, Delivery.target == target)).first()
    return None if row is None else DeliveryView(*row)


@dataclass(frozen=True)
class LineView:
    """A history line as a plugin reads it back."""

    text: str
    data: dict
    at: datetime


def latest_line(session: Session, message_id: int, line_type: str) -> LineView | None:
    """The newest history line of ``line_type`` on the message, None when it has none."""
    row = session.execute(select(HistoryLine.text, HistoryLine.data, HistoryLine.created_at).where(
        HistoryLine.message_id == message_id, HistoryLine.type == line_type)
        .order_by(HistoryLine.id.desc()).limit(1)).first()
    return None if row is None else LineView(row.text, dict(row.data or {}), row.created_at)


# --- parties' protocol profiles and their certificates ----------------------------------

@dataclass(frozen=True)
class StoredCertificate:
    """A certificate of a protocol profile as stored (``usage`` is the protocol's)."""

    id: int
    usage: str
    pem: str
    private_key_pem: str | None
    subject: str
    issuer: str
    not_before: datetime | None
    not_after: datetime | None


@dataclass(frozen=True)
class NewCertificate:
    """A certificate to add to a protocol profile."""

    usage: str
    pem: str
    private_key_pem: str | None
    subject: str
    issuer: str
    not_before: datetime | None
    not_after: datetime | None


@dataclass(frozen=True)
class StoredProfile:
    """A party's profile of one protocol: its ``address`` (an AS2 ID), the protocol's
    ``settings`` and its certificates (in the order they were added)."""

    party: str
    kind: str
    protocol: str
    address: str
    settings: dict
    updated_at: datetime
    certificates: tuple[StoredCertificate, ...] = ()


def _certificate(cert: Certificate) -> StoredCertificate:
    return StoredCertificate(cert.id, cert.usage, cert.pem, cert.private_key_pem,
                             cert.subject, cert.issuer, cert.not_before, cert.not_after)


def _stored(profile: ProtocolProfile) -> StoredProfile:
    return StoredProfile(
        party=profile.party.name, kind=profile.party.kind, protocol=profile.protocol,
        address=profile.address, settings=dict(profile.settings or {}),
        updated_at=profile.updated_at,
        certificates=tuple(_certificate(c) for c in sorted(profile.certificates,
                                                             key=lambda c: c.id)))


def _party(session: Session, kind: str, name: str) -> Party:
    party = session.scalar(select(Party).where(Party.name == name, Party.kind == kind))
    if party is None:
        raise NotFound(no_party(kind, name))
    return party


def _profile_of(party: Party, protocol: str) -> ProtocolProfile | None:
    return next((p for p in party.profiles if p.protocol == protocol), None)


def get_protocol_profile(session: Session, protocol: str, kind: str, name: str
                         ) -> StoredProfile | None:
    """The ``protocol`` profile of the party of ``kind`` named ``name``; None when it
    has none; NotFound when there is no such party."""
    profile = _profile_of(_party(session, kind, name), protocol)
    return None if profile is None else _stored(profile)


def address_holder(session: Session, protocol: str, address: str) -> str | None:
    """The name of the party whose ``protocol`` profile has ``address``, if any."""
    return session.scalar(select(Party.name).join(
        ProtocolProfile, ProtocolProfile.party_id == Party.id).where(
        ProtocolProfile.protocol == protocol, ProtocolProfile.address == address))


def save_protocol_profile(session: Session, protocol: str, kind: str, name: str,
                          address: str, settings: dict, *, remove: Iterable[int] = (),
                          add: Iterable[NewCertificate] = ()) -> StoredProfile:
    """Create or update the party's ``protocol`` profile: its address and settings,
    the certificates of ids ``remove`` taken away and ``add`` added (flushed: the new
    ones have their ids). NotFound when there is no such party."""
    party = _party(session, kind, name)
    profile = _profile_of(party, protocol)
    if profile is None:
        profile = ProtocolProfile(party=party, protocol=protocol, address=address,
                                  settings=settings)
        session.add(profile)
    profile.address, profile.settings = address, dict(settings)
    gone = set(remove)
    for cert in [c for c in profile.certificates if c.id in gone]:
        profile.certificates.remove(cert)
    for new in add:
        profile.certificates.append(Certificate(
            usage=new.usage, pem=new.pem, private_key_pem=new.private_key_pem,
            subject=new.subject[:500], issuer=new.issuer[:500], not_before=new.not_before,
            not_after=new.not_after))
    session.flush()
    return _stored(profile)


def delete_protocol_profile(session: Session, protocol: str, kind: str, name: str) -> None:
    """Delete the party's ``protocol`` profile with its certificates; NotFound when the
    party or its profile is missing."""
    profile = _profile_of(_party(session, kind, name), protocol)
    if profile is None:
        raise NotFound(no_profile(kind, name, protocol.upper()))
    session.delete(profile)
    session.flush()


_LOOKUP = (select(Party.name, Party.kind, ProtocolProfile.protocol, ProtocolProfile.address,
                  ProtocolProfile.settings, ProtocolProfile.updated_at, Certificate.id,
                  Certificate.usage, Certificate.pem, Certificate.private_key_pem,
                  Certificate.subject, Certificate.issuer, Certificate.not_before,
                  Certificate.not_after)
           .join(ProtocolProfile, ProtocolProfile.party_id == Party.id)
           .outerjoin(Certificate, Certificate.profile_id == ProtocolProfile.id)
           .order_by(Certificate.id))


def find_protocol_profile(session: Session, protocol: str, *, address: str | None = None,
                          kind: str | None = None, party: str | None = None
                          ) -> StoredProfile | None:
    """The ``protocol`` profile with ``address`` (of a party of ``kind``), or of the
    party named ``party``, with its certificates, in one statement (a row per
    certificate: a receiver looks up two profiles per request)."""
    where = [ProtocolProfile.protocol == protocol]
    if address is not None:
        where.append(ProtocolProfile.address == address)
    if kind is not None:
        where.append(Party.kind == kind)
    if party is not None:
        where.append(Party.name == party)
    rows = session.execute(_LOOKUP.where(*where)).all()
    if not rows:
        return None
    row = rows[0]
    return StoredProfile(
        party=row.name, kind=row.kind, protocol=row.protocol, address=row.address,
        settings=dict(row.settings or {}), updated_at=row.updated_at,
        certificates=tuple(StoredCertificate(
            r.id, r.usage, r.pem, r.private_key_pem, r.subject, r.issuer, r.not_before,
            r.not_after) for r in rows if r.id is not None))


def profile_parties(session: Session, protocol: str, kind: str) -> list[str]:
    """The names of the parties of ``kind`` that have a ``protocol`` profile, sorted."""
    return list(session.scalars(
        select(Party.name).join(ProtocolProfile, ProtocolProfile.party_id == Party.id)
        .where(ProtocolProfile.protocol == protocol, Party.kind == kind)
        .order_by(Party.name)))


def profile_certificates(session: Session, protocol: str | None = None
                         ) -> list[tuple[str, StoredCertificate]]:
    """Every certificate of the parties' profiles (of ``protocol``; None: of every
    protocol), with the name of the party it belongs to."""
    query = select(Certificate, Party.name).join(
        ProtocolProfile, Certificate.profile_id == ProtocolProfile.id).join(Party)
    if protocol is not None:
        query = query.where(ProtocolProfile.protocol == protocol)
    return [(party, _certificate(cert)) for cert, party in session.execute(query).all()]
