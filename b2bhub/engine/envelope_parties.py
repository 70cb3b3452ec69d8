"""Parties from the envelope (docs/edi.md): a source instance whose ``parties_from`` is
``envelope`` has its messages' from and to taken from the sender and receiver the
inspection read at intake, each the party whose EDI identity it is. A message whose
envelope is missing, or names an identity no party has, is stored all the same, Not
routed, its history saying why (the ``message_not_routed`` alert follows)."""

from __future__ import annotations

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from b2bhub.engine.ack_waits import with_waits
from b2bhub.engine.dispatch import NewMessage, direction_of
from b2bhub.models import Party, PartyIdentity

#: the values of an instance's ``parties_from``: the source's own (its path or its
#: configuration), or the envelope's
SOURCE, ENVELOPE = "source", "envelope"
PARTIES_FROM = (SOURCE, ENVELOPE)


def by_envelope(session: Session, new: NewMessage, parties_from: str = ENVELOPE,
                parties: dict[str, tuple[str, str]] | None = None,
                acks_of: dict | None = None) -> NewMessage:
    """``new`` as it is when its source's ``parties_from`` is not ``envelope``; else with
    from and to its envelope's parties (its direction theirs), or, when they are not
    known, with no target and a ``not_routed`` line giving the reason. ``parties``: the
    party (name, kind) of each identity the envelope names that is one's, when the
    caller read them already (a receiver's lookup); else they are read here. Then, its
    parties known, with the acknowledgment waits it starts
    (:func:`b2bhub.engine.ack_waits.with_waits`, given ``acks_of``)."""
    return with_waits(session, _parties(session, new, parties_from, parties), acks_of)


def _parties(session: Session, new: NewMessage, parties_from: str,
             parties: dict[str, tuple[str, str]] | None) -> NewMessage:
    if parties_from != ENVELOPE:
        return new
    found = envelope_identities((row["name"], row["value"]) for table, row in new.rows
                                if table.name == "message_attributes")
    if not found:
        return _not_routed(new, "no envelope: its parties cannot be taken from it")
    if parties is None:
        parties = _parties_of(session, found.values())
    for role in ("sender", "receiver"):
        if found.get(role) not in parties:
            identity = found.get(role)
            return _not_routed(new, f"envelope {role} {identity} is no party's EDI identity"
                               if identity else f"the envelope names no {role}")
    (sender, sender_kind), (receiver, receiver_kind) = (parties[found["sender"]],
                                                        parties[found["receiver"]])
    new.from_party, new.to_party = sender, receiver
    new.direction = direction_of({sender: sender_kind, receiver: receiver_kind},
                                 sender, receiver)
    return new


def envelope_identities(pairs) -> dict[str, str]:
    """The envelope's ``sender`` and ``receiver`` (``qualifier:id``) among the
    inspection's (name, value) pairs, by role; {} without an envelope."""
    return {name: value for name, value in pairs if name in ("sender", "receiver")}


def _parties_of(session: Session, identities) -> dict[str, tuple[str, str]]:
    """The party (name, kind) of each identity (``qualifier:id``) that is one's."""
    pairs = {tuple(text.split(":", 1)) for text in identities if ":" in text}
    if not pairs:
        return {}
    rows = session.execute(
        select(PartyIdentity.qualifier, PartyIdentity.identifier, Party.name, Party.kind)
        .join(Party, Party.id == PartyIdentity.party_id)
        .where(or_(*(and_(PartyIdentity.qualifier == q, PartyIdentity.identifier == i)
                     for q, i in pairs))))
    return {f"{q}:{i}": (name, kind) for q, i, name, kind in rows}


def _not_routed(new: NewMessage, reason: str) -> NewMessage:
    new.targets = []
    new.lines = [*new.lines, {"type": "not_routed",
                              "text": f"parties from the envelope: {reason}"}]
    return new
