"""Store the derived message status in the transaction of the change that caused it."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from b2bhub.domain.states import LABELS, MessageStatus
from b2bhub.domain.status import ALERTING_STATUSES, derive_status
from b2bhub.engine.ack_waits import acknowledgment_received
from b2bhub.engine.driver import DriverSQL, int_array, word_array
from b2bhub.engine.history import add_lines, connection, raise_alert, resolve_alert
from b2bhub.models import Message

# Built once: claim and settle run these for every batch. SQLite: the ids travel as one
# JSON array (one parameter, the same text for any number of ids, so the driver's
# statement cache keeps it prepared); each message by its primary key, its deliveries
# by the message_id index.
_READ = DriverSQL("""SELECT m.id, m.status, d.state, d.failure_kind
  FROM messages m LEFT JOIN deliveries d ON d.message_id = m.id
 WHERE m.id IN (SELECT value FROM json_each(:ids))""")
# PostgreSQL: the message rows locked (in id order), then their deliveries' states read
# by a later statement, both in one call of the function migration 0037 made: a VOLATILE
# function takes a fresh snapshot for each statement, so the read sees whatever the
# holders of those locks committed. Each message's deliveries are looked up by its id in
# the message_id index, one lookup per message whatever the planner knows (OFFSET 0 keeps
# the subquery a lookup per id: a plain IN list made PostgreSQL scan the whole table
# while it had no statistics).
_LOCKED_STATES = DriverSQL("SELECT * FROM b2bhub_locked_statuses(CAST(:ids AS bigint[]))")
# Every changed status in one UPDATE, whatever the number of distinct new statuses: the
# (id, status) pairs as two arrays on PostgreSQL, where the UPDATE runs in the statement
# that inserts the history lines (``add_lines``' ``pg_with``), one JSON array of pairs on
# SQLite.
_WRITE_PG = """UPDATE messages SET status = u.status, updated_at = :now
  FROM unnest(CAST(:status_ids AS bigint[]), CAST(:statuses AS text[])) AS u(id, status)
 WHERE messages.id = u.id"""
_WRITE_SQLITE = DriverSQL("""UPDATE messages SET status = u.status, updated_at = :now
  FROM (SELECT json_extract(value, '$[0]') AS id,
               json_extract(value, '$[1]') AS status FROM json_each(:pairs)) AS u
 WHERE messages.id = u.id""", ("now",))

#: statuses set outside the deliveries (at intake, or an operator cancelling a message
#: that had none); not re-derived while the message has no deliveries
INTAKE_STATUSES = {MessageStatus.REFUSED, MessageStatus.COLLECTION_ERROR,
                   MessageStatus.CANCELLED}


def refresh_statuses(session: Session, message_ids: Iterable[int], now: datetime,
                     actor: str = "", lines: list[dict] | None = None) -> dict[int, str]:
    """Re-derive the status of these messages; write what changed with a history line.

    ``lines`` are the history lines of the change that caused the refresh; they go into
    the same INSERT as the status lines, ahead of them (one statement per transition).
    Returns {message id: new status} for the messages whose status changed.
    """
    ids = sorted(set(message_ids))
    current, states = _read_statuses(session, ids)
    changed = {}
    for message_id, old in current.items():
        if old in INTAKE_STATUSES and not states[message_id]:
            continue
        new = _derived(tuple(states[message_id]))
        if new != old:
            changed[message_id] = new
    _write_changes(session, changed, current, now, actor, list(lines or []))
    return changed


@functools.lru_cache(maxsize=4096)
def _derived(pairs: tuple[tuple[str, str | None], ...]) -> str:
    """derive_status of stored (state, failure kind) pairs, kept per combination: a
    batch derives the same few combinations for every message it touches."""
    return derive_status(pairs).value


def _read_statuses(session: Session, ids: list[int]
                   ) -> tuple[dict[int, str], dict[int, list[tuple[str, str | None]]]]:
    """Each message's stored status and its deliveries' states.

    On PostgreSQL the message rows are locked first (in id order) and the states read by
    a later statement: two workers settling two deliveries of one message at once would
    otherwise each read the other's delivery as it was, and the later commit would store
    a status derived from a view that was already stale. SQLite has one writer at a time
    and every transition writes before it reads, so one joined query is exact there.

    The two PostgreSQL statements go in one round trip (``b2bhub_locked_statuses``, a
    VOLATILE function: a fresh snapshot for each of its statements), one statement
    fewer per claimed batch: ``python bench/claim_settle.py --backend postgres
    --statements 20000 --rounds 2``, alternated with the two statements sent apart,
    took 20.2-21.8 us a delivery inside the cursor for both, against 27.3-29.6.
    """
    current: dict[int, str] = {}
    states: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
    conn = connection(session)
    postgres = conn.dialect.name == "postgresql"
    for chunk in _chunks(ids, 500):
        rows = (_LOCKED_STATES.run(conn, {"ids": int_array(chunk)}) if postgres
                else _READ.run(conn, {"ids": json.dumps(chunk)})).all()
        for message_id, stored, state, kind in rows:
            current[message_id] = stored
            if state is not None:
                states[message_id].append((state, kind))
    return current, states


def _write_changes(session: Session, changed: dict[int, str], old: dict[int, str],
                   now: datetime, actor: str, lines: list[dict]) -> None:
    pg_with = None
    if changed:
        conn = connection(session)
        if conn.dialect.name == "postgresql":  # in the statement of the lines, below
            pg_with = (_WRITE_PG, {"status_ids": int_array(changed),
                                   "statuses": word_array(changed.values())})
        else:
            _WRITE_SQLITE.run(conn, {"pairs": json.dumps(list(changed.items())),
                                         "now": now})
        _sync_loaded(session, changed, now)
    add_lines(session, lines + [
        {"message_id": mid, "type": "status_changed", "actor": actor,
         "text": f"{LABELS[old[mid]]} → {LABELS[new]}", "data": {"from": old[mid], "to": new}}
        for mid, new in changed.items()], now, pg_with=pg_with)
    for mid, new in changed.items():
        _message_alerts(session, mid, old[mid], new, now)


def _sync_loaded(session: Session, changed: dict[int, str], now: datetime) -> None:
    """Keep Message objects this session holds in step with the Core UPDATE."""
    if not session.identity_map:  # the claim and settle paths load no objects
        return
    for message_id, status in changed.items():
        loaded = session.identity_map.get(identity_key(Message, message_id))
        if loaded is not None:
            set_committed_value(loaded, "status", status)
            set_committed_value(loaded, "updated_at", now)


#: the statuses whose start or end raises or resolves an alert
_ALERTED = ALERTING_STATUSES | {MessageStatus.NOT_ROUTED}


def _message_alerts(session: Session, message_id: int, old: str, new: str,
                    now: datetime) -> None:
    if old not in _ALERTED and new not in _ALERTED:
        return  # most changes (Received, In progress, Delivered) touch no alert
    subject = f"message:{message_id}"
    if new in ALERTING_STATUSES:
        raise_alert(session, "message_failed", subject,
                    f"message {message_id} ended {LABELS[new]}", message_id, now)
    elif old in ALERTING_STATUSES:
        resolve_alert(session, "message_failed", subject, now)
    if new == MessageStatus.NOT_ROUTED:
        # an acknowledgment received is kept, not routed on unless a route asks: no
        # alert (asked in the same statement as the open alert)
        raise_alert(session, "message_not_routed", subject,
                    f"message {message_id}: no route matched", message_id, now,
                    unless=acknowledgment_received(message_id))
    elif old == MessageStatus.NOT_ROUTED:
        resolve_alert(session, "message_not_routed", subject, now)


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]
