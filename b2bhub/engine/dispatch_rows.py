"""A new batch's rows on PostgreSQL in one statement: its messages, their payload
stages, their deliveries and their history lines, and the rows a source keeps of its
own beside each message (``NewMessage.rows``: the AS2 receiver's ``as2_inbound`` row),
so a received AS2 message is one INSERT statement and its commit.

Every statement is a round trip to the server (longer when the server process was idle
between requests), and the AS2 receiver stores one message per request: its four
INSERTs were most of the database time of a receive. Here the four are data-modifying
CTEs of one statement, each kind of row travelling as one JSON array parameter (see
:mod:`b2bhub.engine.rows`), so the text is the same for any batch and is parsed once.
It runs as the driver's own SQL (:class:`b2bhub.engine.driver.DriverSQL`): SQLAlchemy's
cache lookup and bind processing of a ``text()`` this size cost the web process more
than building its parameters.

The CTEs of a statement run in no set order, so each child INSERT takes its message ids
from ``mo``, which reads the messages' INSERT, and the history's from the deliveries'
INSERT: a child row is made from the parent row inserted before it, and the foreign
keys hold. A payload, delivery or history row names its message by its place in the
batch (``message_id`` 1, 2, ... in the JSON); a queued line names its delivery by its
target (``delivery_target``). SQLite takes the statements one by one (they cost no
round trip there), so this is PostgreSQL's alone.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

from sqlalchemy import JSON, Table
from sqlalchemy.engine import Connection

from b2bhub.engine.driver import DriverSQL
from b2bhub.engine.history import LINE_FIELDS, packed_line
from b2bhub.engine.rows import json_recordset, next_id, typed
from b2bhub.models import Delivery, Message, Payload

#: the keys of a payload row and of a delivery row, ``message_id`` first (a place)
PAYLOAD_COLUMNS = ("message_id", "stage", "digest", "size")
DELIVERY_COLUMNS = ("message_id", "target", "state", "attempt", "failures", "wake_count",
                    "last_result", "sequence_key")


def insert_batch(conn: Connection, messages: list[dict], payloads: list[dict],
                 deliveries: list[dict], lines: list[dict], now: datetime,
                 first_rewake: datetime, own: dict[Table, list[dict]] | None = None
                 ) -> tuple[list[int], list[tuple[int, int, str]]]:
    """Insert the rows; the message ids in the order of ``messages``, and (delivery id,
    message id, target) in the order of ``deliveries``. Every row is stamped ``now``;
    a delivery is due now and re-woken by the sweep at ``first_rewake``. ``own``: rows
    of other tables by table, each naming its message by place (``message_id``), all
    of a table with the same keys."""
    packed = [{**packed_line(line), "delivery_target": line.get("delivery_target")}
              for line in lines]
    own = own or {}
    shapes = tuple((table, tuple(rows[0])) for table, rows in own.items())
    params = {f"own{i}": _json(_packed_own_rows(table, rows))
              for i, (table, rows) in enumerate(own.items())}
    rows = _statement(tuple(messages[0]), shapes).run(conn, {
        "messages": _json(messages), "payloads": _json(payloads),
        "deliveries": _json(deliveries), "lines": _json(packed),
        "now": now, "rewake": first_rewake, **params}).all()
    ids = list(dict.fromkeys(mid for mid, _did, _target in rows))
    return ids, [(did, mid, target) for mid, did, target in rows if did is not None]


def _json(rows: list[dict]) -> str:
    return json.dumps(rows, separators=(",", ":"), default=_iso)


def _iso(value):
    """A datetime as PostgreSQL reads it into a timestamp column."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _packed_own_rows(table: Table, rows: list[dict]) -> list[dict]:
    """Rows of another table as they travel: a JSON column's value as the JSON text the
    ORM stores (``null`` for none), cast back by the server (:func:`_own_values`).

    Rows of a table without a JSON column travel as they are. A hand-tuned fast path:
    the 14 ``message_attributes`` rows of a 2 KB X12 file took 35 us of the intake's
    CPU to pack one by one (each column's type looked up on every row), 11 us as they
    are (1,400 rows, ``timeit``); the columns' types are looked up once per shape."""
    json_columns = _json_columns(table, tuple(rows[0]))
    if not json_columns:
        return rows
    return [{name: json.dumps(value) if name in json_columns else value
             for name, value in row.items()} for row in rows]


@functools.cache
def _json_columns(table: Table, columns: tuple[str, ...]) -> frozenset[str]:
    return frozenset(name for name in columns if _is_json(table, name))


def _is_json(table: Table, name: str) -> bool:
    return isinstance(table.c[name].type, JSON)


def _own_fields(table: Table, columns: tuple[str, ...]) -> list[tuple[str, str]]:
    """The recordset fields of another table's rows: a JSON column travels as text."""
    return [(name, "text" if _is_json(table, name) else type_)
            for name, type_ in typed(table, columns)]


def _own_values(table: Table, columns: tuple[str, ...]) -> str:
    return ", ".join("mo.id" if name == "message_id" else
                     f"CAST(r.{name} AS json)" if _is_json(table, name) else f"r.{name}"
                     for name in columns)


def _places(columns: tuple[str, ...]) -> str:
    """A child's columns read from ``r``, its message's id from ``mo``."""
    return ", ".join("mo.id AS message_id" if name == "message_id" else f"r.{name}"
                     for name in columns)


@functools.cache
def _statement(message_columns: tuple[str, ...],
               own: tuple[tuple[Table, tuple[str, ...]], ...] = ()):
    """The statement for messages of these columns and rows of other tables of these
    shapes (:func:`insert_batch`), built once.

    Ids are drawn in the order of the rows: each INSERT reads its rows from a subquery
    sorted by their place (a sorted subquery is not merged into the INSERT), and the
    serial default or ``nextval`` above it draws one id per row as the rows come. So
    the messages' ids sorted ascending are those of the batch in order (``mo`` numbers
    them so), a delivery's id follows the batch's order, and
    the history lines' ids follow the order of ``lines``: SSE event ids rely on that."""
    messages, payloads, deliveries = Message.__table__, Payload.__table__, Delivery.__table__
    joined = "JOIN mo ON mo.n = r.message_id"
    own_ctes = "".join(
        f""",
o{i} AS (
INSERT INTO {table.name} ({", ".join(columns)})
SELECT {_own_values(table, columns)}
FROM {json_recordset(f"own{i}", _own_fields(table, columns))} {joined} ORDER BY r.n)"""
        for i, (table, columns) in enumerate(own))
    sql = f"""WITH m AS (
INSERT INTO messages ({", ".join(message_columns)}, created_at, updated_at)
SELECT {", ".join(f"r.{name}" for name in message_columns)}, :now, :now
FROM {json_recordset("messages", typed(messages, message_columns))} ORDER BY r.n
RETURNING id),
mo AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM m),
p AS (
INSERT INTO payloads ({", ".join(PAYLOAD_COLUMNS)}, created_at)
SELECT {_places(PAYLOAD_COLUMNS)}, :now
FROM {json_recordset("payloads", typed(payloads, PAYLOAD_COLUMNS))} {joined} ORDER BY r.n),
d AS (
INSERT INTO deliveries (id, {", ".join(DELIVERY_COLUMNS)},
due_at, next_wake_at, created_at, updated_at)
SELECT s.id, {", ".join(f"s.{name}" for name in DELIVERY_COLUMNS)},
:now, :rewake, :now, :now
FROM (SELECT {next_id(deliveries)} AS id, o.* FROM (
SELECT {_places(DELIVERY_COLUMNS)}
FROM {json_recordset("deliveries", typed(deliveries, DELIVERY_COLUMNS))} {joined}
ORDER BY r.n) AS o) AS s
RETURNING id, message_id, target),
h AS (
INSERT INTO history (message_id, delivery_id, type, actor, text, data, created_at)
SELECT mo.id, COALESCE(d.id, r.delivery_id), r.type, r.actor, r.text, CAST(r.data AS json),
:now
FROM {json_recordset("lines", [*LINE_FIELDS, ("delivery_target", "text")])} {joined}
LEFT JOIN d ON d.message_id = mo.id AND d.target = r.delivery_target ORDER BY r.n){own_ctes}
SELECT mo.id, d.id, d.target FROM mo LEFT JOIN d ON d.message_id = mo.id
ORDER BY mo.n, d.id"""
    return DriverSQL(sql)
