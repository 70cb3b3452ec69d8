"""Many rows in one INSERT, on PostgreSQL with the rows sent as one JSON parameter.

SQLAlchemy sends a multi-row insert as ``VALUES (...), (...)`` with one parameter per
value: a statement whose text changes with the number of rows, which psycopg parses in
Python at every execution (its cache keeps only statements under 4,096 bytes and 50
parameters) and the server plans anew. Here the rows travel as one JSON array that the
server unpacks in order (``json_to_recordset ... WITH ORDINALITY``): the text is the
same for any number of rows, so psycopg parses it once and the server prepares it.

Ids come back as SQLAlchemy's own bulk insert takes them: the rows are inserted in the
order given, the serial id of each is drawn in that order, so the ids sorted ascending
are those of the rows in order. On SQLite the rows go through SQLAlchemy's own bulk
insert (ids in the order of the rows).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from sqlalchemy import DateTime, Table, bindparam, insert, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

_DIALECT = postgresql.dialect()


def insert_rows(conn: Connection, table: Table, rows: list[dict[str, Any]],
                times: dict[str, Any] | None = None, *, returning_ids: bool = False
                ) -> list[int]:
    """Insert ``rows`` (dicts of the same JSON-safe keys) into ``table``, each with the
    columns of ``times`` (datetimes the same for every row) too. Returns the new ids in
    the order of ``rows`` when ``returning_ids``."""
    if not rows:
        return []
    times = times or {}
    if conn.dialect.name != "postgresql":
        return _insert_rows_core(conn, table, rows, times, returning_ids)
    statement = _statement(table, tuple(rows[0]), tuple(times), returning_ids)
    result = conn.execute(statement, {"rows": json.dumps(rows, separators=(",", ":")),
                                      **times})
    return sorted(result.scalars()) if returning_ids else []


def _insert_rows_core(conn: Connection, table: Table, rows: list[dict[str, Any]],
                      times: dict[str, Any], returning_ids: bool) -> list[int]:
    values = [{**row, **times} for row in rows]
    if not returning_ids:
        conn.execute(insert(table), values)
        return []
    return list(conn.execute(insert(table).returning(table.c.id,
                                                     sort_by_parameter_order=True),
                             values).scalars())


def typed(table: Table, columns: tuple[str, ...]) -> list[tuple[str, str]]:
    """The columns with their PostgreSQL types in ``table``, for :func:`json_recordset`."""
    return [(name, table.c[name].type.compile(dialect=_DIALECT)) for name in columns]


def json_recordset(param: str, fields: list[tuple[str, str]]) -> str:
    """The rows of the JSON array parameter ``param`` as ``r``: its ``fields`` (name,
    type), and ``r.n`` numbering the rows from 1 in the order of the array."""
    names = ", ".join(name for name, _ in fields)
    declared = ", ".join(f"{name} {type_}" for name, type_ in fields)
    return (f"ROWS FROM (json_to_recordset(CAST(:{param} AS json)) AS ({declared})) "
            f"WITH ORDINALITY AS r({names}, n)")


def next_id(table: Table) -> str:
    """The next value of the table's id sequence (the sequence is looked up once)."""
    sequence = f"(SELECT pg_get_serial_sequence('{table.name}', 'id'))"
    return f"nextval(CAST({sequence} AS regclass))"


@functools.cache
def _statement(table: Table, columns: tuple[str, ...], times: tuple[str, ...],
               returning_ids: bool):
    """The INSERT for these columns, built once per shape."""
    ordered = f"SELECT r.* FROM {json_recordset('rows', typed(table, columns))} ORDER BY r.n"
    targets = [*columns, *times]
    values = [f"s.{name}" for name in columns] + [f":{name}" for name in times]
    source = f"({ordered}) AS s"
    sql = (f"INSERT INTO {table.name} ({', '.join(targets)}) "
           f"SELECT {', '.join(values)} FROM {source}"
           + (" RETURNING id" if returning_ids else ""))
    return text(sql).bindparams(*(bindparam(name, type_=DateTime()) for name in times))
