"""Storing a message and dispatching it to its targets in one transaction (SPEC 4).

Routes are read from a per-process cache keyed by the routes version, a value every
route save or delete replaces in its own transaction: a route saved in the web process
applies to the very next dispatch in any worker, with no broadcast to lose. The version
is a fresh random token, never a counter: a table read inside a transaction that then
rolled back is cached under a token no commit will ever store, so it can never pass for
the routes of a later commit (a counter would reach the same number again).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from b2bhub.domain import routing
from b2bhub.domain.states import LABELS, DeliveryState, MessageStatus
from b2bhub.domain.status import derive_status
from b2bhub.engine.dispatch_rows import insert_batch
from b2bhub.engine.history import add_lines, connection, raise_alert
from b2bhub.engine.machine.wake import wakeups_per_target
from b2bhub.engine.rows import insert_rows
from b2bhub.engine.settings import KEY as SETTINGS_KEY
from b2bhub.engine.settings import DeliverySettings, bump_version
from b2bhub.engine.status import refresh_statuses
from b2bhub.engine.wakeups import after_commit
from b2bhub.models import PARTNER, Delivery, Message, Party, Payload, Route, Setting
from b2bhub.observability import tracing

ROUTES_VERSION_KEY = "routes_version"
#: the longest status text kept on a message
STATUS_TEXT_MAX = 2000


class RouteCache:
    """The route table of this process, reloaded when the routes version moved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: int | None = None
        self._table = routing.RouteTable([])

    def table(self, session: Session, known: dict | None = None) -> routing.RouteTable:
        """The routes; ``known`` holds setting rows already read in this transaction
        (:func:`read_settings`), the routes version among them."""
        if known is not None and ROUTES_VERSION_KEY in known:
            version = known[ROUTES_VERSION_KEY] or 0
        else:
            version = session.scalar(select(Setting.value).where(
                Setting.key == ROUTES_VERSION_KEY)) or 0
        with self._lock:
            if version != self._version:
                rows = session.scalars(select(Route).order_by(Route.id)).all()
                self._table = routing.RouteTable(
                    routing.Route(r.id, r.source, r.from_party, r.to_party, r.target,
                                  r.document_type) for r in rows)
                self._version = version
            return self._table

    def clear(self) -> None:
        with self._lock:
            self._version = None


route_cache = RouteCache()

#: the settings rows an intake reads: the routes version and the delivery settings
INTAKE_KEYS = (ROUTES_VERSION_KEY, SETTINGS_KEY)


def read_settings(session: Session, keys) -> dict:
    """Setting rows by key in one statement (a key without a row maps to None), to
    pass as ``known`` to :func:`store_and_dispatch_many` in the same transaction."""
    keys = tuple(keys)
    found = dict(connection(session).execute(_settings_query(keys)).all())
    return {key: found.get(key) for key in keys}


@functools.cache
def _settings_query(keys: tuple[str, ...]):
    """The SELECT of these setting rows, built once (callers ask for the same few sets)."""
    return select(Setting.key, Setting.value).where(Setting.key.in_(keys))


def bump_routes_version(session: Session) -> None:
    """Call in the transaction that saves or deletes a route."""
    bump_version(session, ROUTES_VERSION_KEY)
    route_cache.clear()


@dataclass
class NewMessage:
    """What a source hands over; payload stages are already in the payload store."""

    source: str
    from_party: str
    to_party: str
    stages: dict[str, tuple[str, int]]  # stage -> (digest, size)
    original_filename: str | None = None
    external_id: str | None = None
    correlation_id: str | None = None
    sequence_key: str | None = None
    #: the W3C traceparent the message's trace continues from; None: the dispatch span's
    trace_parent: str | None = None
    actor: str = ""
    targets: list[str] | None = None  # given targets bypass the routes (send by hand)
    data: dict = field(default_factory=dict)
    #: inbound / outbound / internal when the source knows the parties' kinds already
    direction: str | None = None
    #: history lines of the message to add after its own (``type``, ``text``...)
    lines: list[dict] = field(default_factory=list)
    #: rows of other tables (a plugin's own) that belong to the message, inserted in the
    #: same statement as it on PostgreSQL: (table, columns), each given its
    #: ``message_id``; every column without a server default is given (datetimes and
    #: JSON values as they are)
    rows: list[tuple[Table, dict]] = field(default_factory=list)


def direction_of(kinds: dict[str, str], from_party: str, to_party: str) -> str:
    """Inbound from a partner, outbound to one, internal between our organizations."""
    if kinds.get(from_party) == PARTNER:
        return "inbound"
    return "outbound" if kinds.get(to_party) == PARTNER else "internal"


def store_and_dispatch(session: Session, new: NewMessage, now: datetime) -> Message:
    """Insert the message, its payload rows, one delivery per distinct target and the
    history, in the caller's transaction; the wake-ups go out after it commits."""
    [message_id] = store_and_dispatch_many(session, [new], now)
    return session.get(Message, message_id)


def _main_stage(new: NewMessage) -> tuple[str | None, int]:
    """The stage a message's sha256 and size describe: unpacked, else raw, else any."""
    return new.stages.get("unpacked") or new.stages.get("raw") or next(
        iter(new.stages.values()), (None, 0))


def _received_text(new: NewMessage) -> str:
    name = new.original_filename or "a message"
    return f"{name} received from {new.from_party} for {new.to_party} by {new.source}"


def _not_routed_text(new: NewMessage) -> str:
    types = ", ".join(sorted(routing.type_names(document_types(new))))
    return (f"no route from {new.source} matches {new.from_party} → {new.to_party}"
            + (f" for {types}" if types else ""))


def document_types(new: NewMessage) -> list[str]:
    """The types the intake's inspection found (its ``message_attributes`` rows)."""
    return [row["value"] for table, row in new.rows
            if table.name == "message_attributes" and row.get("name") == "document_type"]


def create_deliveries(session: Session, message: Message, targets: list[str],
                      now: datetime, actor: str = "",
                      settings: DeliverySettings | None = None) -> list[Delivery]:
    """One queued delivery per target the message does not have yet; woken after commit."""
    have = set(session.scalars(select(Delivery.target).where(
        Delivery.message_id == message.id)))
    new = [t for t in dict.fromkeys(targets) if t not in have]
    # the wake-up published after commit is the first; the sweep re-wakes from then on
    first_rewake = now + timedelta(seconds=(settings or DeliverySettings()).wake_delay(1))
    rows = [Delivery(message_id=message.id, target=t, state=DeliveryState.QUEUED,
                     due_at=now, next_wake_at=first_rewake, wake_count=1,
                     sequence_key=message.sequence_key, created_at=now, updated_at=now)
            for t in new]
    session.add_all(rows)
    session.flush()
    add_lines(session, [{"message_id": message.id, "delivery_id": r.id,
                         "type": "delivery_changed", "actor": actor,
                         "text": f"{r.target}: queued", "data": {"state": "queued"}}
                        for r in rows], now)
    after_commit(session, [(r.id, r.target) for r in rows])
    return rows


# --- a batch of messages in a handful of statements ---------------------------------

def store_and_dispatch_many(session: Session, batch: list[NewMessage],
                            now: datetime, known: dict | None = None,
                            made: list[tuple[int, int, str]] | None = None) -> list[int]:
    """:func:`store_and_dispatch` for a batch, in the caller's transaction, with one
    statement for its rows on PostgreSQL (one per kind of row on SQLite) instead of
    several per message: the same messages, payload rows, deliveries, history lines,
    statuses and alerts. Returns the message ids in the order of ``batch``.

    Wake-ups (hints: a woken worker drains its target) go out after the commit as the
    sweep sends them: per target, one per batch it may claim at once, not one per
    delivery. ``known``: the :data:`INTAKE_KEYS` rows read in this transaction already
    (:func:`read_settings`); else they are read here, in one statement. ``made``: a list
    extended with (delivery id, message id, target) of each delivery made, for a caller
    that goes on with them (the HTTP receiver's sync mode), without reading them back.
    """
    if not batch:
        return []
    with tracing.span("dispatch", **{"b2bhub.source": batch[0].source,
                                     "b2bhub.messages": len(batch)}) as span:
        ids = _dispatch_many(session, batch, now, known, tracing.traceparent(), made)
        if span is not None:
            span.set_attribute("b2bhub.message_ids", ids[:100])
        return ids


def writes_in_one_statement(session: Session, batch: list[NewMessage],
                            known: dict | None = None) -> bool:
    """Whether :func:`store_and_dispatch_many` of ``batch`` writes with one statement:
    on PostgreSQL (:mod:`b2bhub.engine.dispatch_rows`) when every message has a target
    and no lines of its own (a Not routed message's status, line and alert are
    statements of their own). Such a dispatch is atomic by itself, so a caller may run
    it outside a transaction, sparing the BEGIN and COMMIT round trips. ``known`` as
    for :func:`store_and_dispatch_many`."""
    if session.get_bind().dialect.name != "postgresql" or any(new.lines for new in batch):
        return False
    if known is None or any(key not in known for key in INTAKE_KEYS):
        known = {**read_settings(session, INTAKE_KEYS), **(known or {})}
    return all(_targets_of(session, batch, known))


def _dispatch_many(session: Session, batch: list[NewMessage], now: datetime,
                   known: dict | None, trace_parent: str | None,
                   out: list[tuple[int, int, str]] | None = None) -> list[int]:
    if known is None or any(key not in known for key in INTAKE_KEYS):
        known = {**read_settings(session, INTAKE_KEYS), **(known or {})}
    targets = _targets_of(session, batch, known)
    settings = DeliverySettings.from_dict(known[SETTINGS_KEY])
    ids, made = _insert_batch(session, batch, targets, now, settings, trace_parent)
    # A new message is stored Received; what its new deliveries say of it is known
    # without reading them back: only a message whose status that changes (one with
    # none: Not routed) goes through the derivation, with its line and alert.
    changing = {mid for mid, names in zip(ids, targets, strict=True)
                if _status_of_new(len(names)) != MessageStatus.RECEIVED}
    for actor, members in _by_actor(batch, ids).items():
        if changing.intersection(members):
            refresh_statuses(session, [m for m in members if m in changing], now,
                             actor=actor)
    after_commit(session, wakeups_per_target(session, [(d, t) for d, _m, t in made],
                                             settings))
    if out is not None:
        out.extend(made)
    return ids


@functools.cache
def _status_of_new(deliveries: int) -> str:
    """The status derived for a message with this many deliveries, all queued."""
    return derive_status([(DeliveryState.QUEUED, None)] * deliveries).value


def _insert_batch(session: Session, batch: list[NewMessage], targets: list[list[str]],
                  now: datetime, settings: DeliverySettings, trace_parent: str | None
                  ) -> tuple[list[int], list[tuple[int, int, str]]]:
    """The messages, payload rows, deliveries and history lines of a batch: one
    statement on PostgreSQL (:mod:`b2bhub.engine.dispatch_rows`), one per kind of row
    elsewhere. The message ids in batch order, and (delivery id, message id, target)."""
    kinds = _party_kinds(session, {name for new in batch if new.direction is None
                                   for name in (new.from_party, new.to_party)})
    messages = [_message_row(new, kinds, trace_parent) for new in batch]
    first_rewake = now + timedelta(seconds=settings.wake_delay(1))
    conn = connection(session)
    if conn.dialect.name == "postgresql":
        places = range(1, len(batch) + 1)
        return insert_batch(conn, messages, _payload_rows(batch, places),
                            _delivery_rows(batch, places, targets),
                            _intake_lines(batch, places, targets), now, first_rewake,
                            _own_rows(batch, places))
    ids = insert_rows(conn, Message.__table__, messages, {"created_at": now, "updated_at": now},
                      returning_ids=True)
    insert_rows(conn, Payload.__table__, _payload_rows(batch, ids), {"created_at": now})
    for table, rows in _own_rows(batch, ids).items():
        conn.execute(insert(table), rows)
    rows = _delivery_rows(batch, ids, targets)
    delivery_ids = insert_rows(conn, Delivery.__table__, rows, {
        "due_at": now, "next_wake_at": first_rewake, "created_at": now, "updated_at": now},
        returning_ids=True)
    made = [(did, row["message_id"], row["target"])
            for did, row in zip(delivery_ids, rows, strict=True)]
    add_lines(session, _with_delivery_ids(_intake_lines(batch, ids, targets), made), now)
    return ids, made


def _own_rows(batch: list[NewMessage], keys) -> dict[Table, list[dict]]:
    """The messages' rows of other tables by table, each with its message's key (id or
    place), in the order of the batch."""
    tables: dict[Table, list[dict]] = {}
    for key, new in zip(keys, batch, strict=True):
        for table, row in new.rows:
            tables.setdefault(table, []).append({**row, "message_id": key})
    return tables


def _payload_rows(batch: list[NewMessage], keys) -> list[dict]:
    """The payload rows of the batch, each with its message's key (id or place)."""
    return [{"message_id": key, "stage": stage, "digest": digest, "size": size}
            for key, new in zip(keys, batch, strict=True)
            for stage, (digest, size) in new.stages.items()]


def _party_kinds(session: Session, names: set[str]) -> dict[str, str]:
    """The kind of each named party that exists (no query for no names: a source that
    knows the direction already asks for none)."""
    if not names:
        return {}
    return dict(session.execute(select(Party.name, Party.kind).where(
        Party.name.in_(names))).all())


def _message_row(new: NewMessage, kinds: dict[str, str], trace_parent: str | None) -> dict:
    """A new message's columns but its times."""
    digest, size = _main_stage(new)
    return {"source": new.source, "from_party": new.from_party, "to_party": new.to_party,
            "direction": new.direction or direction_of(kinds, new.from_party, new.to_party),
            "original_filename": new.original_filename, "external_id": new.external_id,
            "correlation_id": new.correlation_id, "status": MessageStatus.RECEIVED,
            "status_text": "",
            "sequence_key": new.sequence_key or f"{new.from_party}>{new.to_party}",
            "sha256": digest, "size": size,
            "trace_parent": new.trace_parent or trace_parent}


def _targets_of(session: Session, batch: list[NewMessage], known: dict
                ) -> list[list[str]]:
    """Each message's distinct targets: given ones, else the routes' (read once)."""
    table = (route_cache.table(session, known) if any(n.targets is None for n in batch)
             else None)
    return [list(dict.fromkeys(new.targets if new.targets is not None
                               else table.targets(new.source, new.from_party,
                                                  new.to_party, document_types(new))))
            for new in batch]


def _delivery_rows(batch: list[NewMessage], keys, targets: list[list[str]]
                   ) -> list[dict]:
    """One queued delivery per target, with its message's key (id or place), in order."""
    return [{"message_id": key, "target": target, "state": DeliveryState.QUEUED.value,
             "attempt": 0, "failures": 0, "wake_count": 1, "last_result": "",
             "sequence_key": new.sequence_key or f"{new.from_party}>{new.to_party}"}
            for key, new, names in zip(keys, batch, targets, strict=True)
            for target in names]


def _intake_lines(batch: list[NewMessage], keys, targets: list[list[str]]) -> list[dict]:
    """Received, then queued per delivery or not routed, as store_and_dispatch writes;
    each with its message's key (id or place), a queued line with its
    ``delivery_target``."""
    lines = [{"message_id": key, "type": "received", "actor": new.actor,
              "text": _received_text(new),
              "data": {"size": _main_stage(new)[1], "sha256": _main_stage(new)[0]}}
             for key, new in zip(keys, batch, strict=True)]
    lines += [{"message_id": key, "delivery_target": target, "type": "delivery_changed",
               "actor": new.actor, "text": f"{target}: queued", "data": {"state": "queued"}}
              for key, new, names in zip(keys, batch, targets, strict=True)
              for target in names]
    lines += [{"message_id": key, "type": "not_routed", "actor": new.actor,
               "text": _not_routed_text(new)}  # unless the message's own lines say why
              for key, new, names in zip(keys, batch, targets, strict=True)
              if not names and all(line.get("type") != "not_routed" for line in new.lines)]
    lines += [{"actor": new.actor, **line, "message_id": key}
              for key, new in zip(keys, batch, strict=True) for line in new.lines]
    return lines


def _with_delivery_ids(lines: list[dict], made: list[tuple[int, int, str]]) -> list[dict]:
    """The lines with the id of the delivery a queued line names by its target."""
    delivery_of = {(mid, target): did for did, mid, target in made}
    for line in lines:
        if (target := line.pop("delivery_target", None)) is not None:
            line["delivery_id"] = delivery_of[line["message_id"], target]
    return lines


def _by_actor(batch: list[NewMessage], ids: list[int]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for mid, new in zip(ids, batch, strict=True):
        groups.setdefault(new.actor, []).append(mid)
    return groups


def _insert_intake_message(session: Session, new: NewMessage, status: MessageStatus,
                           status_text: str, now: datetime) -> int:
    """The row of a message whose status is set at intake (never derived); its id."""
    kinds = _party_kinds(session, {new.from_party, new.to_party}
                         if new.direction is None else set())
    row = {**_message_row(new, kinds, tracing.traceparent()), "created_at": now, "updated_at": now}
    row["status"], row["status_text"] = status, status_text[:STATUS_TEXT_MAX]
    return session.scalar(insert(Message).returning(Message.id), row)


def _insert_payload_rows(session: Session, message_id: int, new: NewMessage,
                         now: datetime) -> None:
    conn = connection(session)  # then its rows of other tables (attributes, an ack job)
    insert_rows(conn, Payload.__table__, _payload_rows([new], [message_id]), {"created_at": now})
    for table, rows in _own_rows([new], [message_id]).items():
        conn.execute(insert(table), rows)


def store_refused(session: Session, new: NewMessage, reason: str, now: datetime) -> int:
    """Record a message a source turned down on its merits (status Refused, no
    deliveries, no alert), with what was received and the reason in its history."""
    message_id = _insert_intake_message(session, new, MessageStatus.REFUSED, reason, now)
    _insert_payload_rows(session, message_id, new, now)
    add_lines(session, [
        {"message_id": message_id, "type": "received", "actor": new.actor,
         "text": _received_text(new), "data": {"size": _main_stage(new)[1]}},
        {"message_id": message_id, "type": "refused", "actor": new.actor, "text": reason},
        {"message_id": message_id, "type": "status_changed", "actor": new.actor,
         "text": "Refused", "data": {"to": MessageStatus.REFUSED}},
        *({"actor": new.actor, **line, "message_id": message_id} for line in new.lines)],
        now)
    return message_id


def store_collection_error(session: Session, new: NewMessage, text: str, now: datetime,
                           data: dict | None = None) -> int:
    """Record a fetch a scheduled source could not make: a message in status Collection
    error with ``text`` (the reason and the answer's start) as its status text and in a
    ``collection_failed`` line, no payload (``new.stages`` is empty), no deliveries; it
    raises ``message_failed`` as a failed delivery does. Returns the message id."""
    message_id = _insert_intake_message(session, new, MessageStatus.COLLECTION_ERROR, text,
                                        now)
    add_lines(session, [
        {"message_id": message_id, "type": "collection_failed", "actor": new.actor,
         "text": text, "data": data},
        {"message_id": message_id, "type": "status_changed", "actor": new.actor,
         "text": LABELS[MessageStatus.COLLECTION_ERROR],
         "data": {"to": MessageStatus.COLLECTION_ERROR}}], now)
    raise_alert(session, "message_failed", f"message:{message_id}",
                f"message {message_id}: {new.source} could not collect: {text}"[:500],
                message_id, now)
    return message_id


#: the source of the messages a protocol sends to test a connection (a partner profile's
#: "Test connection"): no instance can have it (the name rule), no route is matched for
#: it and nothing dispatches it again (:func:`b2bhub.engine.operator.redispatch`)
TEST_SOURCE = "(connection test)"


def store_test_message(session: Session, new: NewMessage, now: datetime) -> int:
    """Record a connection test's message (``new.source`` is set to :data:`TEST_SOURCE`):
    In progress, no deliveries, never routed; its ``lines`` (naming the operator) and
    stages as given. :func:`finish_test_message` gives it its outcome."""
    new.source = TEST_SOURCE
    message_id = _insert_intake_message(session, new, MessageStatus.IN_PROGRESS,
                                        "connection test running", now)
    _insert_payload_rows(session, message_id, new, now)
    add_lines(session, [{"actor": new.actor, **line, "message_id": message_id}
                        for line in new.lines], now)
    return message_id


def finish_test_message(session: Session, message_id: int, ok: bool | None, text: str,
                        now: datetime, actor: str = "") -> None:
    """A connection test's message ends Delivered (every step passed) or Error, or waits
    for the partner's receipt (``ok`` None: Awaiting receipt), with ``text`` as its status
    text; no alert (the operator reads the answer at once)."""
    status = (MessageStatus.AWAITING_RECEIPT if ok is None else
              MessageStatus.DELIVERED if ok else MessageStatus.ERROR)
    message = session.get(Message, message_id)
    old = message.status
    message.status, message.status_text, message.updated_at = status, text[:2000], now
    add_lines(session, [{"message_id": message_id, "type": "status_changed", "actor": actor,
                         "text": f"{LABELS[old]} → {LABELS[status]}",
                         "data": {"from": old, "to": status}}], now)
