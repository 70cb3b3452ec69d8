"""What a receiving endpoint reads before it stores a message, in one statement.

An intake over HTTP pays a round trip to PostgreSQL per statement, and most of its own
work is waiting on them: the instance (enabled, its configuration), the parties the
message goes between, the settings rows a new message needs (``INTAKE_KEYS``) and
whatever the endpoint keeps of its own (a token's row, a Message-ID seen before) are
read in one. :class:`EndpointLookup` is that statement, declared once by a source and
built once per shape; on PostgreSQL it runs as psycopg's own SQL on the driver's cursor
(:func:`b2bhub.engine.driver.run_read`). It is the core's, offered to every source
through :mod:`b2bhub.plugin`: a plugin names what it needs, never the core's tables.

Shape of the statement: the instance (when looked up) and the parties are outer joins
on one row, so each table is read once and a missing row reads as NULL (scalar
subqueries, the instance's repeated for each value of it, took twice the planning);
each setting and each of the endpoint's own values is a scalar subquery.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import String, and_, bindparam, func, literal, null, select

from b2bhub.engine.driver import run_read
from b2bhub.engine.envelope_checks import IntakeChecks
from b2bhub.engine.history import connection
from b2bhub.models import Party, PartyIdentity, PluginInstance, Setting


@dataclass(frozen=True)
class Looked:
    """What :meth:`EndpointLookup.run` read.

    ``enabled`` and ``config``: the instance's (None when it was not looked up, or there
    is none); ``parties``: each role's party name (given, else the instance's
    configuration's value of that name); ``kinds``: the kind of each of those parties
    that exists, by name; ``settings``: the settings rows' values by key (None: no row);
    ``extra``: the endpoint's own values by name (None when not asked for);
    ``parties_from``: the instance's (``source`` when it was not looked up);
    ``identities``: the party (name, kind) of each EDI identity given that is one's;
    ``checks``: the instance's intake checks, ``parties_from`` among them (docs/edi.md
    "Checks at intake"; the defaults when it was not looked up)."""

    enabled: bool | None
    config: dict | None
    parties: dict[str, str | None]
    kinds: dict[str, str]
    settings: dict[str, Any]
    extra: dict[str, Any]
    parties_from: str = "source"
    identities: dict[str, tuple[str, str]] = field(default_factory=dict)
    checks: IntakeChecks = field(default_factory=IntakeChecks)


class EndpointLookup:
    """One endpoint's reads, declared once (at import) by its plugin type.

    ``plugin_type``: the type whose instance is looked up by name. ``settings``: the
    settings keys to read. ``parties``: role names (``from_party``, ``to_party``) whose
    party kind is read; each is given at :meth:`run` or, when the instance is looked up,
    taken from the instance's configuration key of the same name (an empty text: none).
    ``extra``: the endpoint's own values, by name, as scalar subqueries over its own
    tables (bound parameters are given at :meth:`run`; the instance's name is
    ``:instance``). ``identities``: role names (``sender``, ``receiver``) of EDI
    identities (``qualifier:id``, an envelope's) whose party is read when given at
    :meth:`run` (docs/edi.md "Parties from the envelope")."""

    def __init__(self, plugin_type: str, *, settings: tuple[str, ...] = (),
                 parties: tuple[str, ...] = (), extra: dict[str, Any] | None = None,
                 identities: tuple[str, ...] = ()):
        self.plugin_type = plugin_type
        self.settings = tuple(settings)
        self.parties = tuple(parties)
        self.extra = dict(extra or {})
        self.identities = tuple(identities)

    def run(self, session, instance: str, *, look_up_instance: bool = True,
            parties: dict[str, str | None] | None = None,
            extra: tuple[str, ...] | None = None,
            identities: dict[str, str | None] | None = None, **params: Any) -> Looked:
        """Read it all in one statement on ``session``'s connection. ``instance``: the
        instance's name (read only when ``look_up_instance``); ``parties``: the given
        party names by role; ``extra``: the names of :attr:`extra` to read this time
        (default all); ``identities``: the EDI identities by role whose parties to read
        (none given: the statement has no part for them); ``params``: the extra values'
        bound parameters."""
        wanted = tuple(self.extra) if extra is None else tuple(extra)
        given = parties or {}
        named = {i: tuple(((identities or {}).get(role) or "").partition(":")[::2])
                 for i, role in enumerate(self.identities)}
        with_identities = any(q and v for q, v in named.values())
        values = {"instance": instance, **params,
                  **{f"party_{i}": given.get(role) for i, role in enumerate(self.parties)}}
        if with_identities:
            values.update({f"idq_{i}": q or None for i, (q, _v) in named.items()})
            values.update({f"idv_{i}": v or None for i, (_q, v) in named.items()})
        row = run_read(connection(session), _statement(
            self, look_up_instance, frozenset(wanted), with_identities), values).one()
        names = {role: getattr(row, f"party_{i}") for i, role in enumerate(self.parties)}
        kinds = {name: getattr(row, f"kind_{i}") for i, name in enumerate(names.values())
                 if name is not None and getattr(row, f"kind_{i}") is not None}
        config = None
        if look_up_instance and row.enabled is not None:
            config = dict(row.config or {})
        found = {f"{q}:{v}": (getattr(row, f"idn_{i}"), getattr(row, f"idk_{i}"))
                 for i, (q, v) in named.items()
                 if with_identities and getattr(row, f"idn_{i}") is not None}
        checks = IntakeChecks.of(row) if look_up_instance and row.enabled is not None \
            else IntakeChecks()
        return Looked(
            enabled=None if row.enabled is None else bool(row.enabled), config=config,
            parties=names, kinds=kinds,
            settings={key: getattr(row, f"s{i}") for i, key in enumerate(self.settings)},
            extra={name: getattr(row, f"x{i}") if name in wanted else None
                   for i, name in enumerate(self.extra)},
            parties_from=checks.parties_from, identities=found, checks=checks)

    def statement(self, look_up_instance: bool = True, extra: tuple[str, ...] | None = None):
        """The statement of one shape (built once per shape; :func:`run_read` compiles it
        once)."""
        wanted = tuple(self.extra) if extra is None else tuple(extra)
        return _statement(self, look_up_instance, frozenset(wanted))


#: the instance's columns of its intake checks (:class:`IntakeChecks`), read with it
CHECKS = ("parties_from", "edi_errors", "duplicates", "duplicate_days")


@functools.cache
def _statement(lookup: EndpointLookup, look_up_instance: bool, wanted: frozenset,
               with_identities: bool = False):
    instances, parties = PluginInstance.__table__, Party.__table__
    identities = PartyIdentity.__table__ if with_identities else None

    def party(i: int, role: str):
        given = bindparam(f"party_{i}", type_=String)
        if not look_up_instance:
            return given
        configured = instances.c.config[role].as_string()
        return func.coalesce(given, func.nullif(configured, ""))

    columns = [select(Setting.value).where(Setting.key == key).scalar_subquery()
               .label(f"s{i}") for i, key in enumerate(lookup.settings)]
    columns += [(value if name in wanted else null()).label(f"x{i}")
                for i, (name, value) in enumerate(lookup.extra.items())]
    inner = [party(i, role).label(f"party_{i}") for i, role in enumerate(lookup.parties)]
    if identities is not None:
        inner += [bindparam(f"id{part}_{i}", type_=String).label(f"id{part}_{i}")
                  for i, _role in enumerate(lookup.identities) for part in "qv"]
    if look_up_instance:
        inner += [instances.c.enabled, instances.c.config,
                  *(instances.c[name] for name in CHECKS)]
    if not inner:
        return select(*columns, null().label("enabled"), null().label("config"),
                      *(null().label(name) for name in CHECKS))
    one_row = select(*inner)
    if look_up_instance:
        one = select(literal(1).label("one")).subquery("one")
        one_row = one_row.select_from(one.outerjoin(instances, and_(
            instances.c.name == bindparam("instance"),
            instances.c.type == lookup.plugin_type)))
    one_row = one_row.subquery("wanted")
    joined = one_row
    for i, _role in enumerate(lookup.parties):
        alias = parties.alias(f"party_{i}")
        columns += [getattr(one_row.c, f"party_{i}"), alias.c.kind.label(f"kind_{i}")]
        joined = joined.outerjoin(alias, alias.c.name == getattr(one_row.c, f"party_{i}"))
    for i, _role in enumerate(lookup.identities if identities is not None else ()):
        named, holder = identities.alias(f"identity_{i}"), parties.alias(f"holder_{i}")
        columns += [holder.c.name.label(f"idn_{i}"), holder.c.kind.label(f"idk_{i}")]
        joined = joined.outerjoin(named, and_(
            named.c.qualifier == getattr(one_row.c, f"idq_{i}"),
            named.c.identifier == getattr(one_row.c, f"idv_{i}"))).outerjoin(
            holder, holder.c.id == named.c.party_id)
    columns += [one_row.c[name] if look_up_instance else null().label(name)
                for name in ("enabled", "config", *CHECKS)]
    return select(*columns).select_from(joined)
