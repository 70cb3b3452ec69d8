"""The hot statements of a drain as the driver's own SQL.

A claim and its settlement send a handful of statements per batch, each through
``Connection.execute`` of a ``text()`` or Core construct: SQLAlchemy looks the statement
up in its compiled cache, builds its parameters through every bind processor and wraps
the cursor in a result with its own processors. For these few statements, whose text
never changes, :class:`DriverSQL` keeps the SQL in the driver's parameter style, built
once, and runs it with ``Connection.exec_driver_sql``: the same connection and the same
transaction as every other statement of the settlement, the same cursor events (the
statements are still counted, logged and traced), and the same text at every execution,
so psycopg's prepared statements and SQLite's statement cache still hit.

What the bind processors did is done here for the parameters that need it: a time on
SQLite is written in the text form the ORM writes (a raw datetime of a whole second
would lose its ``.000000`` and compare as earlier than the stored ones).

A statement goes to the driver's cursor itself (:func:`run_raw`): what
``exec_driver_sql`` adds for a statement whose callers read plain tuples (an execution
context, a result with its metadata, built from ``cursor.description``, which psycopg
makes column by column) cost about as much of the worker's CPU as psycopg's own work for
the statement, and on SQLite as much as SQLite's. What the callers rely on is kept: the
statement runs on the connection and in the transaction SQLAlchemy holds (begun first if
none is), the cursor events are fired as SQLAlchemy fires them, and an error is raised
as SQLAlchemy raises it (wrapped, a lost connection invalidated) by SQLAlchemy's own
handler.
"""

from __future__ import annotations

import collections
import enum
import functools
import re
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.exc import MultipleResultsFound, NoResultFound

_NAMED = re.compile(r"(?<![:\w]):(\w+)")
_SQLITE_NAMED = sqlite.dialect(paramstyle="named")


class DriverSQL:
    """One statement written with ``:name`` parameters, run in the driver's style
    (psycopg ``%(name)s``, sqlite3 ``:name``). ``times``: the parameters that are times.
    ``named``: its rows are read by column name (``row.lane``) as well as by place."""

    def __init__(self, sql: str, times: tuple[str, ...] = (),
                 fixed: dict[str, Any] | None = None, named: bool = False):
        self.text = sql
        self.pyformat = _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))
        self.times, self.fixed, self.named = times, fixed or {}, named

    @classmethod
    def sqlite_of(cls, clause, times: tuple[str, ...] = ()) -> DriverSQL:
        """The SQLite text of a Core construct, compiled once with named parameters;
        the values the construct holds itself (its literals) are kept with it."""
        compiled = clause.compile(dialect=_SQLITE_NAMED)
        return cls(str(compiled), times, _literals(compiled))

    def typed_row(self, conn: Connection, params: dict[str, Any], columns):
        """The one row (or None) of a statement whose result columns are ``columns``
        (Core columns, in order), each value as SQLAlchemy's type reads it, by name or
        place like a Core row: on PostgreSQL psycopg loads them so itself (``named``);
        on SQLite each column's result processor is applied (JSON text to its value, 0
        and 1 to booleans, text to times)."""
        row = self.run(conn, params).one_or_none()
        if row is None or conn.dialect.name == "postgresql":
            return row
        make, processors = _typed(conn.dialect, tuple(columns))
        return make(*[value if convert is None or value is None else convert(value)
                      for convert, value in zip(processors, row, strict=True)])

    def run(self, conn: Connection, params: dict[str, Any]) -> CursorResult | Rows:
        """Run it on ``conn``; read the result with ``all()``, ``scalars()`` or
        ``rowcount`` (a :class:`Rows`, rows as tuples)."""
        if conn.dialect.name == "postgresql":
            return run_raw(conn, self.pyformat, params, self.named)
        if self.fixed:
            params = {**self.fixed, **params}
        if self.times:
            write = _sqlite_time(conn.dialect)
            params = dict(params)
            for name in self.times:
                value = params.get(name)
                if isinstance(value, datetime):
                    params[name] = write(value)
        return run_raw(conn, self.text, params)


def int_array(values) -> str:
    """A list of integers as PostgreSQL's array text (``{1,2,3}``), for a parameter the
    statement casts (``CAST(:ids AS bigint[])``): psycopg dumps a Python list element by
    element in Python, a cost per statement of the same order as the statement's own."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def word_array(values) -> str:
    """A list of plain words (a status, a state: letters, digits and ``_`` only, not
    ``NULL``) as PostgreSQL's array text; anything else is refused rather than quoted."""
    words = list(values)
    if not all(_WORD.fullmatch(word) and word.upper() != "NULL" for word in words):
        raise ValueError(f"not plain words: {words!r}")
    return "{" + ",".join(words) + "}"


_WORD = re.compile(r"[A-Za-z0-9_]+")


class Rows:
    """A statement's result read straight off the driver's cursor (rows as tuples)."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor):
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def all(self) -> list[tuple]:
        return self._cursor.fetchall()

    def scalars(self) -> list[Any]:
        return [row[0] for row in self._cursor.fetchall()]

    def one(self):
        rows = self._cursor.fetchall()
        if len(rows) != 1:
            raise (MultipleResultsFound("more than one row where one was expected")
                   if rows else NoResultFound("no row where one was expected"))
        return rows[0]

    def one_or_none(self):
        rows = self._cursor.fetchall()
        if len(rows) > 1:
            raise MultipleResultsFound("more than one row where at most one was expected")
        return rows[0] if rows else None


def run_raw(conn: Connection, sql: str, params: Any, named: bool = False,
            many: bool = False) -> Rows | CursorResult:
    """``sql`` (in the driver's parameter style) on the driver's own cursor of
    ``conn``, as ``exec_driver_sql`` would run it (module docstring); with statement
    logging on, through it (it logs). ``named`` (psycopg): rows as named tuples, one
    class per set of column names, kept. ``many``: ``params`` is a list of rows, run
    with the driver's ``executemany``."""
    if conn._echo:
        return conn.exec_driver_sql(sql, params)
    if not conn.in_transaction():
        conn.begin()  # as SQLAlchemy's autobegin: its commit() then commits this
    dbapi = conn.connection.dbapi_connection
    cursor = dbapi.cursor(row_factory=_namedtuple_row()) if named else dbapi.cursor()
    events = conn._has_events or conn.engine._has_events
    try:
        if events:
            for listener in conn.dispatch.before_cursor_execute:
                sql, params = listener(conn, cursor, sql, params, None, many)
        if many:
            cursor.executemany(sql, params)
        else:
            cursor.execute(sql, params)
        if events:
            conn.dispatch.after_cursor_execute(conn, cursor, sql, params, None, many)
    except BaseException as exc:
        conn._handle_dbapi_exception(exc, sql, params, cursor, None)
    return Rows(cursor)


@functools.cache
def _namedtuple_row():
    """psycopg's row factory, imported on a first named run: a process on SQLite never
    loads psycopg (its C extension and libpq: about 0.1 s of every process's start)."""
    from psycopg.rows import namedtuple_row
    return namedtuple_row


@functools.cache
def _postgresql_dialect():
    from sqlalchemy.dialects.postgresql import psycopg
    return psycopg.dialect()


#: each read's PostgreSQL text, by the statement's identity (the statement is kept with
#: it, so the identity stays its own): a handful of statements built once each
_READS: dict[int, tuple[Any, str, dict[str, Any]]] = {}


def run_read(conn: Connection, clause, params: dict[str, Any]) -> Rows | CursorResult:
    """Execute a read built once (a cached Core construct). On PostgreSQL it runs as
    psycopg's own SQL, compiled at its first use, with the values the construct holds
    itself (its literals), on the driver's cursor (:func:`run_raw`, rows as named
    tuples): for a read whose columns need no result processing on psycopg (its own
    loaders read json, numbers and text), SQLAlchemy's cache key, parameter and result
    work for a statement of some size cost more than the statement. Elsewhere it is
    ``conn.execute``. Either way a row's columns are read by name as attributes."""
    if conn.dialect.name != "postgresql":
        return conn.execute(clause, params)
    made = _READS.get(id(clause))
    if made is None or made[0] is not clause:
        compiled = clause.compile(dialect=_postgresql_dialect())
        made = _READS[id(clause)] = (clause, str(compiled), _literals(compiled))
    _clause, sql, fixed = made
    return run_raw(conn, sql, {**fixed, **params}, named=True)


def _literals(compiled) -> dict[str, Any]:
    """The values a compiled construct holds itself (its literals), by parameter name."""
    return {compiled.bind_names[bind]: _plain(bind.value)
            for bind in set(compiled.binds.values()) if not bind.required}


def _plain(value: Any) -> Any:
    """A literal as sqlite3 binds it (an enum member by its value)."""
    return value.value if isinstance(value, enum.Enum) else value


@functools.cache
def _typed(dialect, columns: tuple) -> tuple[type, list]:
    """A named tuple of these columns and each one's result processor on ``dialect``."""
    make = collections.namedtuple("Row", [column.key for column in columns])
    return make, [column.type._cached_result_processor(dialect, None) for column in columns]


@functools.cache
def _sqlite_time(dialect):
    """How SQLAlchemy's DateTime writes a time on this dialect (SQLite: text)."""
    return DateTime().dialect_impl(dialect).bind_processor(dialect) or (lambda value: value)
