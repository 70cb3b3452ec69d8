"""Routes, the route table and the name rule (SPEC 4).

A route sends messages of one source instance, from a party (or ``*``) to a party (or
``*``), of a document type (or ``*``), to one target instance. Dispatch makes one
delivery per distinct target, so overlapping routes to the same target never deliver
twice; saving a route that is redundant with an existing one is refused. Plain Python:
no Flask, no SQLAlchemy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from b2bhub.domain.i18n import N_, joined

#: The wildcard a route uses for "any party".
ANY = "*"

#: Names of parties and plugin instances: 1-64 of a-z, 0-9, ``_`` and ``-``.
NAME_RE = re.compile(r"[a-z0-9_-]{1,64}")


#: the name rule as a form's help says it
NAME_RULE = N_("1-64 characters of a-z, 0-9, '_' and '-'")


def validate_name(name: str) -> str | None:
    """Return an error message when ``name`` breaks the name rule, else None.

    The rule keeps names safe in URLs, queue names (``delivery.<instance>``) and file
    paths, and keeps ``*`` free for the route wildcard.
    """
    if isinstance(name, str) and NAME_RE.fullmatch(name):
        return None
    return N_("name %(name)r must be %(rule)s", name=name, rule=NAME_RULE)


#: A route's document type: an X12 transaction set (``850``) or an EDIFACT message type
#: (``ORDERS``), upper case, or ``*`` for any message, EDI or not.
DOCUMENT_TYPE_RE = re.compile(r"[A-Z0-9]{1,35}")

#: the document type rule as a form's help says it
DOCUMENT_TYPE_RULE = N_("'*', or 1-35 of A-Z and 0-9 (850, ORDERS)")


def validate_document_type(value: str) -> str | None:
    """Return an error message when ``value`` is no route document type, else None."""
    if value == ANY or (isinstance(value, str) and DOCUMENT_TYPE_RE.fullmatch(value)):
        return None
    return N_("document type %(value)r must be %(rule)s", value=value,
              rule=DOCUMENT_TYPE_RULE)


def type_names(document_types: Iterable[str] | None) -> frozenset[str]:
    """The types a route may name of an envelope's ``document_type`` values: an X12
    ``850`` as it is, an EDIFACT ``ORDERS:D:96A`` by its first component."""
    return frozenset(t.split(":", 1)[0] for t in document_types or () if t)


def _types_text(names: frozenset[str]) -> str:
    return ", ".join(sorted(names))


@dataclass(frozen=True)
class Route:
    """One route; ``from_party``/``to_party`` are a party name or ``*``,
    ``document_type`` a document type or ``*``.

    The document type rule: a message's types are those of every transaction set or
    message of its envelope (:func:`type_names`); a route naming a type matches when it
    is among them, so an interchange holding an 850 and an 810 takes both an ``850``
    route and an ``810`` route. ``*`` matches any message, with an envelope or without;
    a route naming a type never matches a message without an envelope.
    """

    id: int | None
    source: str
    from_party: str
    to_party: str
    target: str
    document_type: str = ANY

    def covers(self, other: Route) -> bool:
        """True when every message ``other`` routes is also routed by this route."""
        return (self.source == other.source and self.target == other.target
                and self.from_party in (ANY, other.from_party)
                and self.to_party in (ANY, other.to_party)
                and self.document_type in (ANY, other.document_type))

    def matches(self, source: str, from_party: str, to_party: str,
                document_types: Iterable[str] | None = None) -> bool:
        """True when a message from ``source``, ``from_party`` to ``to_party`` whose
        envelope holds ``document_types`` (None or empty: no envelope) takes it."""
        return not self.mismatches(source, from_party, to_party, document_types)

    def describe(self) -> str:
        """A one-line description for messages, e.g. ``route 3: inbox, * -> acme, out``
        (``route 4: inbox, * -> acme, 850, erp`` for a route naming a document type): a
        text of ours (:func:`N_`), so a sentence naming the route shows it in the
        reader's language."""
        ends = {"source": self.source, "from_party": self.from_party,
                "to_party": self.to_party, "target": self.target}
        if self.document_type != ANY:
            ends["document_type"] = self.document_type
            if self.id is None:
                return N_("new route: %(source)s, %(from_party)s -> %(to_party)s, "
                          "%(document_type)s, %(target)s", **ends)
            return N_("route %(id)s: %(source)s, %(from_party)s -> %(to_party)s, "
                      "%(document_type)s, %(target)s", id=self.id, **ends)
        if self.id is None:
            return N_("new route: %(source)s, %(from_party)s -> %(to_party)s, %(target)s",
                      **ends)
        return N_("route %(id)s: %(source)s, %(from_party)s -> %(to_party)s, %(target)s",
                  id=self.id, **ends)

    def mismatches(self, source: str, from_party: str, to_party: str,
                   document_types: Iterable[str] | None = None) -> list[str]:
        """Say which fields do not match, so the route tester can explain a miss (texts
        of ours, :func:`N_`: the tester's page shows them in the reader's language)."""
        fields = (("source", source, self.source, False),
                  ("from", from_party, self.from_party, True),
                  ("to", to_party, self.to_party, True))
        misses = [N_("%(field)s %(given)r does not match %(wanted)r", field=field,
                     given=given, wanted=wanted)
                  for field, given, wanted, wildcard in fields
                  if given != wanted and not (wildcard and wanted == ANY)]
        if self.document_type != ANY:
            names = type_names(document_types)
            if not names:
                misses.append(N_("document type %(wanted)r wanted, and the message has "
                                 "no envelope", wanted=self.document_type))
            elif self.document_type not in names:
                misses.append(N_("document type %(wanted)r is not among the message's "
                                 "types (%(types)s)", wanted=self.document_type,
                                 types=_types_text(names)))
        return misses


@dataclass(frozen=True)
class RouteMatch:
    """One target a message reaches, with every route that sends it there."""

    target: str
    routes: tuple[Route, ...]


class RouteTable:
    """The routes, queried by dispatch and by the route tester."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes: tuple[Route, ...] = tuple(routes)

    def match(self, source: str, from_party: str, to_party: str,
              document_types: Iterable[str] | None = None) -> list[RouteMatch]:
        """One :class:`RouteMatch` per distinct target reached, sorted by target name;
        ``document_types``: the message's envelope's (None or empty: no envelope)."""
        types = type_names(document_types)
        by_target: dict[str, list[Route]] = {}
        for route in self.routes:
            if route.matches(source, from_party, to_party, types):
                by_target.setdefault(route.target, []).append(route)
        return [RouteMatch(target, tuple(by_target[target])) for target in sorted(by_target)]

    def targets(self, source: str, from_party: str, to_party: str,
                document_types: Iterable[str] | None = None) -> list[str]:
        """The distinct targets reached: dispatch makes one delivery for each."""
        return [m.target for m in self.match(source, from_party, to_party, document_types)]

    def explain(self, source: str, from_party: str, to_party: str,
                document_types: Iterable[str] | None = None) -> list[dict]:
        """For every route: whether it matches and, when not, which field failed."""
        types = type_names(document_types)
        return [_explanation(route, source, from_party, to_party, types)
                for route in self.routes]


def _explanation(route: Route, source: str, from_party: str, to_party: str,
                 types: frozenset[str]) -> dict:
    """The route tester's line for one route."""
    misses = route.mismatches(source, from_party, to_party, types)
    return {"route": route.id, "target": route.target,
            "document_type": route.document_type, "matched": not misses,
            "reason": joined(misses) if misses else N_("matches")}


def redundant_with(new: Route, existing: Iterable[Route]) -> Route | None:
    """Return the existing route that makes ``new`` redundant, or None.

    Redundant means same source and target with one route covering the other (either
    way, exact duplicates included): the covered route would never add a delivery the
    other does not already make. An existing route with the same id as ``new`` is the
    one being edited and is skipped.
    """
    for route in existing:
        if new.id is not None and route.id == new.id:
            continue
        if route.covers(new) or new.covers(route):
            return route
    return None
