"""Party profiles of the kinds plugin types add (SPEC 2, SPEC 3): found in the registry.

The core stores every kind in ``protocol_profiles`` (protocol = the kind); a kind's
:class:`b2bhub.plugin.ProfileKind` validates, stores and shows it. Several types of
one protocol (a receiver and a sender) may name the same kind: it is served once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.engine.history import raise_alert, resolve_alert
from b2bhub.models import Certificate, Party, ProtocolProfile
from b2bhub.services.errors import NotFound


def profile_kinds(registry) -> dict:
    """Every profile kind of the registered types, and the core's own (``openpgp``:
    :mod:`b2bhub.services.openpgp_profiles`), by kind, sorted."""
    from b2bhub.services.openpgp_profiles import OPENPGP_PROFILES

    kinds: dict = {OPENPGP_PROFILES.kind: OPENPGP_PROFILES}
    for cls in registry.types().values():
        for kind in getattr(cls, "profile_kinds", ()) or ():
            kinds.setdefault(kind.kind, kind)
    return dict(sorted(kinds.items()))


def profile_kind(registry, kind: str):
    """The kind named ``kind``; NotFound names the known ones."""
    kinds = profile_kinds(registry)
    if kind not in kinds:
        raise NotFound(N_("no profile kind '%(kind)s'; known: %(known)s", kind=kind,
                          known=", ".join(kinds) or "none"))
    return kinds[kind]


def run_connection_test(session: Session, found, name: str, actor: str, options: dict):
    """A partner's connection test by its profile kind ``found`` (it commits its own
    work); NotFound for a kind that has none."""
    if not getattr(found, "can_test", False):
        raise NotFound(N_("the %(kind)s profile has no connection test",
                          kind=found.label or found.kind))
    return found.test_connection(session, name, actor, options)


def offered_actions(found, party_kind: str) -> tuple[str, ...]:
    """The actions a profile of kind ``found`` offers on a party of ``party_kind``."""
    from b2bhub.plugin import ProfileKind  # its default, for a kind that sets none
    if party_kind not in getattr(found, "action_parties", ProfileKind.action_parties):
        return ()
    return tuple(getattr(found, "actions", ()) or ())


def run_profile_action(session: Session, found, party_kind: str, name: str, action: str,
                       body: dict, actor: str) -> dict:
    """An operator's action on a party's profile of kind ``found``
    (``ProfileKind.actions``); NotFound for an action the kind does not offer, or
    does not offer on this kind of party (``ProfileKind.action_parties``)."""
    offered = offered_actions(found, party_kind)
    if action not in offered:
        raise NotFound(N_("the %(kind)s profile has no action '%(action)s'; offered: "
                          "%(offered)s", kind=found.label or found.kind, action=action,
                          offered=", ".join(offered) or "none"))
    return found.run_action(session, party_kind, name, action, body, actor)


def addresses(session: Session, kinds) -> dict[str, dict[int, str]]:
    """Each kind's profile addresses (its AS2 ID, say) by party id, for the parties page."""
    shown: dict[str, dict[int, str]] = {kind: {} for kind in kinds}
    if shown:
        rows = session.execute(select(ProtocolProfile.protocol, ProtocolProfile.party_id,
                                      ProtocolProfile.address)
                               .where(ProtocolProfile.protocol.in_(list(shown))))
        for protocol, party_id, address in rows:
            shown[protocol][party_id] = address
    return shown


#: how soon a certificate's end is flagged on the Parties page and the dashboard
CERTIFICATE_WARNING = timedelta(days=30)


@dataclass(frozen=True)
class EndingCertificate:
    party_id: int
    party: str
    kind: str
    protocol: str
    subject: str
    not_after: datetime
    expired: bool


def ending_certificates(session: Session, now: datetime) -> list[EndingCertificate]:
    """The certificates of every profile that have ended or end within 30 days, soonest
    first (a profile may hold several: a renewed one is still listed until removed)."""
    rows = session.execute(
        select(Party.id, Party.name, Party.kind, ProtocolProfile.protocol,
               Certificate.subject, Certificate.not_after)
        .join(ProtocolProfile, Certificate.profile_id == ProtocolProfile.id)
        .join(Party, ProtocolProfile.party_id == Party.id)
        .where(Certificate.not_after.is_not(None),
               Certificate.not_after <= now + CERTIFICATE_WARNING)
        .order_by(Certificate.not_after))
    return [EndingCertificate(*row, expired=row.not_after <= now) for row in rows]


# --- the certificate_expiring alert (beat, hourly; and when a certificate is saved) --

CERTIFICATE_EXPIRING = "certificate_expiring"


def certificate_name(found, protocol: str) -> str:
    """What a certificate of the profile kind ``found`` is called in alerts."""
    if found is None:
        return f"{protocol} certificate"
    return found.certificate_name or f"{found.label or found.kind} certificate"


def certificate_alert(session: Session, party: str, name: str, cert, now: datetime
                      ) -> bool:
    """Raise ``certificate_expiring`` for a certificate (any object with ``id``,
    ``subject`` and ``not_after``) that has ended or ends within 30 days, else resolve
    it; True when raised. ``name``: :func:`certificate_name`'s, e.g. "OpenPGP key"."""
    subject = f"certificate:{party}:{cert.id}"
    if cert.not_after is not None and cert.not_after - now <= CERTIFICATE_WARNING:
        when = "expired" if cert.not_after <= now else "expires"
        raise_alert(session, CERTIFICATE_EXPIRING, subject,
                    f"the {name} of {party} ({cert.subject}) {when} "
                    f"{cert.not_after:%Y-%m-%d %H:%M} UTC", now=now)
        return True
    resolve_alert(session, CERTIFICATE_EXPIRING, subject, now)
    return False


def check_certificates(session: Session, registry, now: datetime) -> int:
    """The certificates of every profile kind (AS2 certificates, OpenPGP keys...): the
    alert raised for each that has ended or ends within 30 days, resolved for one no
    longer ending (renewed by a longer one under the same row, or its alert left from
    a clock moved back). Returns how many are ending. In the caller's transaction."""
    kinds = profile_kinds(registry)
    rows = session.execute(
        select(Certificate, Party.name, ProtocolProfile.protocol)
        .join(ProtocolProfile, Certificate.profile_id == ProtocolProfile.id)
        .join(Party, ProtocolProfile.party_id == Party.id).order_by(Certificate.id))
    return sum(certificate_alert(session, party, certificate_name(kinds.get(protocol),
                                                                  protocol), cert, now)
               for cert, party, protocol in rows)
