"""EDI identities: how a party is named in an interchange's envelope (docs/edi.md).

An identity is ``qualifier:id`` as the inspectors store a sender or receiver: X12
ISA05:ISA06 (``ZZ:ACME``, ``01:123456789``), EDIFACT UNB S002/S003 (``14:4012345000009``).
A party may have several; one identity belongs to one party at most. Plain Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from b2bhub.domain.i18n import N_

#: the qualifier: 1-4 letters or digits
QUALIFIER_RE = re.compile(r"[A-Za-z0-9]{1,4}")
#: the id: 1-35 characters, none a separator an envelope uses or a control character
ID_RE = re.compile(r"[^*~'+:\x00-\x1f\x7f]{1,35}")

#: the rule as a form's help says it
IDENTITY_RULE = N_("qualifier:id, the qualifier 1-4 letters or digits, the id 1-35 "
                   "characters without * ~ ' + or :")


def parse_identity(text: object) -> tuple[str, str]:
    """``(qualifier, id)`` of ``qualifier:id``; ValueError saying why it is no identity."""
    if not isinstance(text, str):
        raise ValueError(N_("EDI identity %(text)r must be text: %(rule)s", text=text,
                            rule=IDENTITY_RULE))
    qualifier, colon, ident = text.strip().partition(":")
    if not (colon and QUALIFIER_RE.fullmatch(qualifier) and ID_RE.fullmatch(ident)
            and ident == ident.strip()):
        raise ValueError(N_("EDI identity %(text)r must be %(rule)s", text=text,
                            rule=IDENTITY_RULE))
    return qualifier, ident


def parse_identities(texts: Iterable[object]) -> list[tuple[str, str]]:
    """Every identity of ``texts``, distinct, in the order given; ValueError naming the
    first that is none."""
    return list(dict.fromkeys(parse_identity(text) for text in texts))


def identity_text(qualifier: str, ident: str) -> str:
    return f"{qualifier}:{ident}"


#: what a partner gets for each interchange it sends us: nothing, an X12 997 or 999
#: (EDIFACT interchanges get a CONTRL with either)
FUNCTIONAL_ACKS = ("none", "997", "999")
#: the longest wait for a partner's acknowledgment that can be set: 30 days
MOST_ACK_HOURS = 720


def check_ack_settings(functional_acks: object, ack_hours: object) -> dict[str, str]:
    """The errors of a partner's acknowledgment settings, by field (empty: none)."""
    errors = {}
    if functional_acks not in FUNCTIONAL_ACKS:
        errors["functional_acks"] = N_("must be one of %(choices)s",
                                       choices=", ".join(FUNCTIONAL_ACKS))
    if ack_hours is not None and (isinstance(ack_hours, bool) or not isinstance(
            ack_hours, int) or not 1 <= ack_hours <= MOST_ACK_HOURS):
        errors["ack_hours"] = N_("must be empty or a whole number of hours, 1-%(most)s",
                                 most=MOST_ACK_HOURS)
    return errors
