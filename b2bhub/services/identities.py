"""Parties' EDI identities and acknowledgment settings (docs/edi.md): set from the API,
the UI and fixture files, each identity one party's at most, every change a history line
naming the operator."""

from __future__ import annotations

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from b2bhub.domain import edi
from b2bhub.domain.i18n import N_, joined
from b2bhub.engine.history import add_line
from b2bhub.models import Party, PartyIdentity
from b2bhub.services.errors import Conflict, ServiceError

FIELD = "edi_identities"
#: the most identities one party may have (far beyond any real use)
MOST = 100


def set_identities(session: Session, party: Party, texts: object, actor: str = "") -> None:
    """Make ``texts`` (``qualifier:id`` each; None: leave them) the party's identities,
    refusing one that is another party's (409 ``identity_taken``, naming the party)."""
    if texts is None:
        return
    if not isinstance(texts, list | tuple):
        raise ServiceError(N_("%(field)s must be a list of %(rule)s", field=FIELD,
                              rule=edi.IDENTITY_RULE),
                           {FIELD: "not a list"})
    try:
        wanted = edi.parse_identities(texts)
    except ValueError as exc:
        raise ServiceError(exc.args[0], {FIELD: exc.args[0]}) from None
    if len(wanted) > MOST:
        raise ServiceError(N_("%(field)s: at most %(most)s identities", field=FIELD,
                              most=MOST), {FIELD: "too many"})
    _refuse_taken(session, party, wanted)
    before = party.edi_identities
    if [edi.identity_text(*pair) for pair in wanted] == before:
        return
    kept = {(i.qualifier, i.identifier): i for i in party.identities}
    for pair, row in kept.items():
        if pair not in wanted:
            party.identities.remove(row)
    session.flush()  # the removed ones go before a new row may take their key
    for qualifier, ident in wanted:
        if (qualifier, ident) not in kept:
            party.identities.append(PartyIdentity(qualifier=qualifier, identifier=ident))
    session.flush()
    add_line(session, None, "config_changed",
             f"{actor}: EDI identities of {party.kind} {party.name}: "
             f"{_listed(party.edi_identities)} (were {_listed(before)})", actor=actor,
             data={FIELD: party.edi_identities, "before": before})


def set_ack_settings(session: Session, party: Party, settings: dict, actor: str = "") -> None:
    """Set the party's ``functional_acks`` and ``ack_hours`` from those of ``settings``
    given (a key left out: unchanged); 400 naming each bad one."""
    wanted = {key: settings[key] for key in ACK_FIELDS if key in settings}
    if not wanted:
        return
    before = {key: getattr(party, key) for key in ACK_FIELDS}
    after = {**before, **wanted}
    errors = edi.check_ack_settings(after["functional_acks"], after["ack_hours"])
    if errors:
        raise ServiceError(joined(N_("%(field)s %(problem)s", field=key, problem=text)
                                  for key, text in errors.items()), errors)
    if after == before:
        return
    for key, value in after.items():
        setattr(party, key, value)
    session.flush()
    add_line(session, None, "config_changed",
             f"{actor}: EDI acknowledgments of {party.kind} {party.name}: "
             f"{_acks(after)} (were {_acks(before)})", actor=actor,
             data={"after": after, "before": before})


ACK_FIELDS = ("functional_acks", "ack_hours")


def _acks(settings: dict) -> str:
    sent = settings["functional_acks"]
    hours = settings["ack_hours"]
    return (f"sends {'none' if sent == 'none' else sent + ' / CONTRL'}, "
            f"expects {'none' if hours is None else f'within {hours} h'}")


def _listed(identities: list[str]) -> str:
    return ", ".join(identities) or "none"


def _refuse_taken(session: Session, party: Party, wanted: list[tuple[str, str]]) -> None:
    if not wanted:
        return
    taken = session.execute(
        select(PartyIdentity.qualifier, PartyIdentity.identifier, Party.kind, Party.name)
        .join(Party, Party.id == PartyIdentity.party_id)
        .where(PartyIdentity.party_id != party.id,
               or_(*(and_(PartyIdentity.qualifier == q, PartyIdentity.identifier == i)
                     for q, i in wanted)))
        .order_by(PartyIdentity.id).limit(1)).first()
    if taken is not None:
        text = edi.identity_text(taken.qualifier, taken.identifier)
        said = ({"whole": N_("EDI identity %(text)s is already organization %(name)s's"),
                 "part": N_("%(text)s is organization %(name)s's")}
                if taken.kind == "organization" else
                {"whole": N_("EDI identity %(text)s is already partner %(name)s's"),
                 "part": N_("%(text)s is partner %(name)s's")})
        raise Conflict(N_(said["whole"], text=text, name=taken.name),
                       {FIELD: N_(said["part"], text=text, name=taken.name)},
                       code="identity_taken")


def party_of(session: Session, identity: str) -> str | None:
    """The name of the party whose identity ``identity`` (``qualifier:id``) is, or None."""
    qualifier, _colon, ident = identity.partition(":")
    return session.scalar(select(Party.name).join(
        PartyIdentity, PartyIdentity.party_id == Party.id).where(
        PartyIdentity.qualifier == qualifier, PartyIdentity.identifier == ident))
