"""Parties from the envelope (docs/edi.md): a source instance whose ``parties_from`` is
``envelope`` has its messages' from and to taken from the sender and receiver the
inspection read at intake, each the party whose EDI identity it is. A message whose
envelope is missing, or names an identity no party has, is stored all the same, Not
routed, its history saying why (the ``message_not_routed`` alert follows)."""

from __future__ import annotations

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from b2bhub.engine.ack_waits import with_waits
from b2bhub.engine.dispatch import NewMessage
from b2bhub.models import Party, PartyIdentity

#: the values of an instance's ``parties_from``: the source's own (its path or its
#: configuration), or the envelope's
SOURCE, ENVELOPE = "source", "envelope"
PARTIES_FROM = (SOURCE, ENVELOPE)


def by_envelope(session: Session, new: NewMessage, parties_from: str = ENVELOPE
                ) -> NewMessage:
    """``new`` as it is when its source's ``parties_from`` is not ``envelope``; else with
    from and to its envelope's parties, or, when they are not known, with no target and
    a ``not_routed`` line giving the reason. Then, its parties known, with the
    acknowledgment waits it starts (:func:`b2bhub.engine.ack_waits.with_waits`)."""
    return with_waits(session, _parties(session, new, parties_from))


def _parties(session: Session, new: NewMessage, parties_from: str) -> NewMessage:
    if parties_from != ENVELOPE:
        return new
    found = {row["name"]: row["value"] for table, row in new.rows
             if table.name == "message_attributes" and row.get("name") in ("sender",
                                                                           "receiver")}
    if not found:
        return _not_routed(new, "no envelope: its parties cannot be taken from it")
    parties = _parties_of(session, found.values())
    for role in ("sender", "receiver"):
        if found.get(role) not in parties:
            identity = found.get(role)
            return _not_routed(new, f"envelope {role} {identity} is no party's EDI identity"
                               if identity else f"the envelope names no {role}")
    new.from_party, new.to_party = parties[found["sender"]], parties[found["receiver"]]
    return new


def _parties_of(session: Session, identities) -> dict[str, str]:
    """The party of each identity (``qualifier:id``) that is one's."""
    pairs = {tuple(text.split(":", 1)) for text in identities if ":" in text}
    if not pairs:
        return {}
    rows = session.execute(
        select(PartyIdentity.qualifier, PartyIdentity.identifier, Party.name)
        .join(Party, Party.id == PartyIdentity.party_id)
        .where(or_(*(and_(PartyIdentity.qualifier == q, PartyIdentity.identifier == i)
                     for q, i in pairs))))
    return {f"{q}:{i}": name for q, i, name in rows}


def _not_routed(new: NewMessage, reason: str) -> NewMessage:
    new.targets = []
    new.lines = [*new.lines, {"type": "not_routed",
                              "text": f"parties from the envelope: {reason}"}]
    return new
