"""History lines and alerts: written inside the transaction of the change they record.

The lines an operator would look for in the Logs page are also logged at info
(logger ``b2bhub.history``): every configuration change, operator action (by whoever
did it), delivery failure and retry, and every alert raised and resolved."""

from __future__ import annotations

import functools
import json
import logging
from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from b2bhub.engine.driver import DriverSQL, run_raw
from b2bhub.engine.rows import json_recordset
from b2bhub.models import Alert, HistoryLine, utcnow

_INSERT_LINES = insert(HistoryLine.__table__)

log = logging.getLogger("b2bhub.history")

#: history lines logged at info besides every ``*_requested`` (an operator's action)
LOGGED_TYPES = frozenset({
    "config_changed", "alert_acknowledged", "instance_started", "instance_stopped",
    "instance_blocked", "instance_released", "user_created", "user_changed",
    "user_deleted", "token_created", "token_revoked", "refused", "mdn_failed",
    "mdn_retrying", "mdn_refused", "receipt_refused", "audit_exported"})
#: the delivery states a ``delivery_changed`` line is logged for: failures and retries
LOGGED_STATES = frozenset({"failed", "retrying", "stalled"})


def log_line(message_id: int | None, type_: str, text: str, actor: str = "",
             delivery_id: int | None = None, data: dict | None = None) -> None:
    """Log a history line at info when it is one an operator would look for."""
    if not _logged(type_, data):
        return
    where = "".join((f" message {message_id}" if message_id else "",
                     f" delivery {delivery_id}" if delivery_id else "",
                     f" by {actor}" if actor and actor not in text else ""))
    log.info("%s%s: %s", type_, where, text)


def _logged(type_: str, data: dict | None) -> bool:
    return type_ in LOGGED_TYPES or type_.endswith("_requested") or (
        type_ == "delivery_changed" and (data or {}).get("state") in LOGGED_STATES)


def data_json(data: dict | None) -> str:
    """``json.dumps(data)``, kept per distinct value: the lines of a batch carry the same
    few (a state, an attempt number, a target; a status change). The types are part of
    the key, so ``1`` and ``True`` (equal in Python) keep their own texts."""
    if data is None:
        return "null"
    if not isinstance(data, dict):
        return json.dumps(data)
    items = tuple(data.items())
    try:
        return _data_json(items, tuple([type(value) for _key, value in items]))
    except TypeError:  # a value that cannot be a key (a list, a dict): as it is
        return json.dumps(data)


@functools.lru_cache(maxsize=4096)
def _data_json(items: tuple, _types: tuple) -> str:
    return json.dumps(dict(items))


def connection(session: Session) -> Connection:
    """The session's connection, for the hot paths of claim and settle: a Core statement
    on it costs a fraction of one through ``Session.execute``. Pending ORM changes are
    flushed first, so statements see them as they would through the session."""
    if session.new or session.dirty or session.deleted:
        session.flush()
    return session.connection()


def add_line(session: Session, message_id: int | None, type_: str, text: str = "", *,
             actor: str = "", delivery_id: int | None = None, data: dict | None = None,
             now: datetime | None = None) -> None:
    """Add one history line; its id becomes the SSE event id."""
    session.add(HistoryLine(message_id=message_id, delivery_id=delivery_id, type=type_,
                            actor=actor, text=text, data=data, created_at=now or utcnow()))
    log_line(message_id, type_, text, actor, delivery_id, data)


def add_lines(session: Session, rows: list[dict], now: datetime | None = None, *,
              pg_with: tuple[str, dict] | None = None) -> None:
    """Insert many lines in one statement (claims and the sweep touch rows in batches).

    ``pg_with``: (SQL, parameters) of a data-modifying statement that PostgreSQL runs in
    the same statement, ahead of the INSERT (``WITH w AS (...) INSERT ...``): the status
    UPDATE of the change the lines record, one round trip for both. Its SQL names its
    parameters itself, ``:now`` aside (the lines' time).

    A claimed batch writes four lines per delivery, so this is a hot path: on
    PostgreSQL the rows travel as one JSON array that the server unpacks in order
    (``json_to_recordset``: one parameter instead of seven per line); on SQLite they go
    to the driver's own executemany as plain tuples, each value converted once here.
    Either way ``data`` is stored as the same JSON text the ORM stores."""
    if not rows:
        if pg_with is not None:
            raise ValueError("pg_with needs lines to write")
        return
    for row in rows:
        if _logged(row["type"], row.get("data")):
            log_line(row.get("message_id"), row["type"], row.get("text", ""),
                     row.get("actor", ""), row.get("delivery_id"), row.get("data"))
    stamp = now or utcnow()
    conn = connection(session)
    if conn.dialect.name == "postgresql":
        params = {"rows": json.dumps([packed_line(row) for row in rows]), "now": stamp}
        if pg_with is None:
            _PG_LINES.run(conn, params)
        else:
            _pg_lines_after(pg_with[0]).run(conn, {**pg_with[1], **params})
    elif conn.dialect.name == "sqlite":
        created = _created_at(conn.dialect)(stamp)
        run_raw(conn, _SQLITE_LINES, [
            (row.get("message_id"), row.get("delivery_id"), row["type"], row.get("actor", ""),
             row.get("text", ""), data_json(row.get("data")), created) for row in rows],
            many=True)
    else:
        conn.execute(_INSERT_LINES, [{"message_id": None, "delivery_id": None, "actor": "",
                                      "text": "", "data": None, "created_at": stamp, **row}
                                     for row in rows])


_COLUMNS = "message_id, delivery_id, type, actor, text, data, created_at"
_SQLITE_LINES = f"INSERT INTO history ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
#: a line's fields as PostgreSQL unpacks them from JSON (:func:`packed_line`)
LINE_FIELDS = [("message_id", "bigint"), ("delivery_id", "bigint"), ("type", "text"),
               ("actor", "text"), ("text", "text"), ("data", "text")]
_PG_LINES_SQL = f"""INSERT INTO history ({_COLUMNS})
    SELECT r.message_id, r.delivery_id, r.type, r.actor, r.text, CAST(r.data AS json), :now
      FROM {json_recordset("rows", LINE_FIELDS)} ORDER BY r.n"""
_PG_LINES = DriverSQL(_PG_LINES_SQL)


@functools.cache
def _pg_lines_after(sql: str) -> DriverSQL:
    """The lines' INSERT run after the data-modifying statement ``sql`` (built once)."""
    return DriverSQL(f"WITH w AS ({sql})\n{_PG_LINES_SQL}")


def packed_line(row: dict) -> dict:
    """A line as it travels in a JSON array to PostgreSQL: ``data`` as the JSON text
    the ORM stores (``null`` for none), cast back to JSON by the server."""
    return {"message_id": row.get("message_id"), "delivery_id": row.get("delivery_id"),
            "type": row["type"], "actor": row.get("actor", ""), "text": row.get("text", ""),
            "data": data_json(row.get("data"))}


@functools.cache
def _created_at(dialect):
    """How the dialect writes a time (SQLite: the ORM's text form, so times compare)."""
    column_type = HistoryLine.__table__.c.created_at.type
    return column_type.dialect_impl(dialect).bind_processor(dialect) or (lambda value: value)


def raise_alert(session: Session, kind: str, subject: str, text: str,
                message_id: int | None = None, now: datetime | None = None,
                unless=None) -> bool:
    """Open an alert unless one of the same kind is open for the subject; True if new.
    ``unless``: an EXISTS clause that, true, raises none, read in the same statement."""
    opened = select(Alert.id).where(Alert.kind == kind, Alert.subject == subject,
                                    Alert.resolved_at.is_(None))
    if unless is None:
        if session.scalar(opened.limit(1)) is not None:
            return False
    elif any(session.execute(select(opened.exists(), unless)).one()):
        return False
    session.add(Alert(kind=kind, subject=subject, text=text, message_id=message_id,
                      created_at=now or utcnow()))
    log.info("alert raised: %s %s: %s", kind, subject, text)
    return True


def resolve_alert(session: Session, kind: str, subject: str,
                  now: datetime | None = None) -> None:
    """Close the open alert of this kind for the subject, when the condition is gone."""
    resolved = session.execute(update(Alert).where(
        Alert.kind == kind, Alert.subject == subject, Alert.resolved_at.is_(None),
    ).values(resolved_at=now or utcnow())).rowcount
    if resolved:
        log.info("alert resolved: %s %s", kind, subject)
