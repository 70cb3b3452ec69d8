"""What a batch's attempts read of their messages when the claim did not return it: the
message's columns and its payload stages, in one statement (SQLite's drain, and the
single claim of an HTTP request on either backend).

On SQLite the read goes to the driver's own cursor (:mod:`b2bhub.engine.driver`), its
ids one JSON array (``json_each``): one statement text for any batch, where the Core
``IN`` of an expanding parameter was rendered, bound and its rows processed by
SQLAlchemy at every batch. Only ``created_at`` needs SQLAlchemy's result processing
(SQLite stores a time as text); it is applied to that column alone. In one process,
``python bench/claim_settle.py --backend embedded --cpu 3000 --rounds 3``, twice each,
the code before and after alternated (2026-12-06, load average 4.6 to 5.1), the
engine's CPU a delivery fell from 148 to 130 us at the median of six rounds (129-154
before, 107-147 after; the floor's 24-45 us either way).
"""

from __future__ import annotations

import functools
import json

from sqlalchemy import DateTime, text
from sqlalchemy.orm import Session

from b2bhub.engine.driver import DriverSQL

_COLUMNS = """m.id, m.source, m.from_party, m.to_party, m.direction,
       m.original_filename, m.external_id, m.correlation_id, m.sequence_key, m.created_at,
       m.trace_parent, p.stage, p.digest, p.size"""
#: the index of ``created_at`` in a row
_CREATED_AT = 9
_READ_SQLITE = DriverSQL(f"""SELECT {_COLUMNS}
  FROM messages m LEFT JOIN payloads p ON p.message_id = m.id
 WHERE m.id IN (SELECT value FROM json_each(:ids))""")
# PostgreSQL: each message's payload rows looked up by its id (OFFSET 0 keeps the
# subquery a lookup per message), whatever the planner knows: a join made it scan the
# whole payloads table while it had no statistics.
_READ_PG = text(f"""SELECT {_COLUMNS}
  FROM messages m
  LEFT JOIN LATERAL (SELECT p.stage, p.digest, p.size FROM payloads p
                      WHERE p.message_id = m.id OFFSET 0) AS p ON true
 WHERE m.id = ANY(CAST(:ids AS bigint[]))""")


def read_messages(session: Session, ids: list[int]
                  ) -> tuple[dict[int, list], dict[int, dict[str, tuple[str, int]]]]:
    """The messages ``ids`` (each its columns as the claim returns them, the payload
    stages left out) and their payload stages, {stage: (digest, size)}, by message id;
    in the session's transaction (the caller ends it)."""
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        rows = conn.execute(_READ_PG, {"ids": ids}).all()
        created = None
    else:
        rows = _READ_SQLITE.run(conn, {"ids": json.dumps(ids)}).all()
        created = _time_of(conn.dialect)
    messages: dict[int, list] = {}
    stages: dict[int, dict[str, tuple[str, int]]] = {}
    for *message, stage, digest, size in rows:
        if created is not None:
            message[_CREATED_AT] = created(message[_CREATED_AT])
        messages[message[0]] = message
        found = stages.setdefault(message[0], {})
        if stage is not None:
            found[stage] = (digest, size)
    return messages, stages


@functools.cache
def _time_of(dialect):
    """How SQLAlchemy's DateTime reads a stored time on this dialect (SQLite: text)."""
    return DateTime().dialect_impl(dialect).result_processor(dialect, None) or (
        lambda value: value)
