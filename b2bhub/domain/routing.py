"""Routes, the route table and the name rule (SPEC 4).

A route sends messages of one source instance, from a party (or ``*``) to a party (or
``*``), to one target instance. Dispatch makes one delivery per distinct target, so
overlapping routes to the same target never deliver twice; saving a route that is
redundant with an existing one is refused. Plain Python: no Flask, no SQLAlchemy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: The wildcard a route uses for "any party".
ANY = "*"

#: Names of parties and plugin instances: 1-64 of a-z, 0-9, ``_`` and ``-``.
NAME_RE = re.compile(r"[a-z0-9_-]{1,64}")


#: the name rule as a form's help says it
NAME_RULE = "1-64 characters of a-z, 0-9, '_' and '-'"


def validate_name(name: str) -> str | None:
    """Return an error message when ``name`` breaks the name rule, else None.

    The rule keeps names safe in URLs, queue names (``delivery.<instance>``) and file
    paths, and keeps ``*`` free for the route wildcard.
    """
    if isinstance(name, str) and NAME_RE.fullmatch(name):
        return None
    return f"name {name!r} must be {NAME_RULE}"


@dataclass(frozen=True)
class Route:
    """One route; ``from_party``/``to_party`` are a party name or ``*``."""

    id: int | None
    source: str
    from_party: str
    to_party: str
    target: str

    def covers(self, other: Route) -> bool:
        """True when every message ``other`` routes is also routed by this route."""
        return (self.source == other.source and self.target == other.target
                and self.from_party in (ANY, other.from_party)
                and self.to_party in (ANY, other.to_party))

    def matches(self, source: str, from_party: str, to_party: str) -> bool:
        """True when a message from ``source``, ``from_party`` to ``to_party`` takes it."""
        return not self.mismatches(source, from_party, to_party)

    def describe(self) -> str:
        """A one-line description for messages, e.g. ``route 3: inbox, * -> acme, out``."""
        label = f"route {self.id}" if self.id is not None else "new route"
        return f"{label}: {self.source}, {self.from_party} -> {self.to_party}, {self.target}"

    def mismatches(self, source: str, from_party: str, to_party: str) -> list[str]:
        """Say which fields do not match, so the route tester can explain a miss."""
        fields = (("source", source, self.source, False),
                  ("from", from_party, self.from_party, True),
                  ("to", to_party, self.to_party, True))
        return [f"{field} {given!r} does not match {wanted!r}"
                for field, given, wanted, wildcard in fields
                if given != wanted and not (wildcard and wanted == ANY)]


@dataclass(frozen=True)
class RouteMatch:
    """One target a message reaches, with every route that sends it there."""

    target: str
    routes: tuple[Route, ...]


class RouteTable:
    """The routes, queried by dispatch and by the route tester."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes: tuple[Route, ...] = tuple(routes)

    def match(self, source: str, from_party: str, to_party: str) -> list[RouteMatch]:
        """One :class:`RouteMatch` per distinct target reached, sorted by target name."""
        by_target: dict[str, list[Route]] = {}
        for route in self.routes:
            if route.matches(source, from_party, to_party):
                by_target.setdefault(route.target, []).append(route)
        return [RouteMatch(target, tuple(by_target[target])) for target in sorted(by_target)]

    def targets(self, source: str, from_party: str, to_party: str) -> list[str]:
        """The distinct targets reached: dispatch makes one delivery for each."""
        return [m.target for m in self.match(source, from_party, to_party)]

    def explain(self, source: str, from_party: str, to_party: str) -> list[dict]:
        """For every route: whether it matches and, when not, which field failed."""
        return [_explanation(route, source, from_party, to_party) for route in self.routes]


def _explanation(route: Route, source: str, from_party: str, to_party: str) -> dict:
    """The route tester's line for one route."""
    misses = route.mismatches(source, from_party, to_party)
    return {"route": route.id, "target": route.target, "matched": not misses,
            "reason": "; ".join(misses) or "matches"}


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
