"""The audit export (docs/audit.md): every history line of a period, the operators'
actions and the configuration changes among them (``config_changed``, ``user_*``,
``token_*``, ``*_requested``), as CSV or JSON Lines, in id order.

The lines are read through a server-side cursor (``yield_per``: PostgreSQL a named
cursor, SQLite its own stepping cursor) on a connection of its own and written out a
batch at a time, so an export of any size holds one batch in memory. The period is
turned into a range of ids first (``first_id_since``: a binary search on the primary
key, as ids grow with time), so the filters ride the primary key. The export is itself
a line (``audit_exported``) naming who took it and what, written before the stream
starts and outside the period it exports."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from b2bhub.engine.history import add_line
from b2bhub.engine.stats import first_id_since
from b2bhub.models import HistoryLine

FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}
COLUMNS = ("id", "created_at", "type", "actor", "message_id", "delivery_id", "text", "data")
BATCH = 1000


@dataclass(frozen=True)
class Export:
    since: datetime
    until: datetime | None
    actor: str | None
    type: str | None
    format: str
    #: the ids of the lines it may hold: ``start <= id < stop``
    start: int
    stop: int


def begin(session: Session, since: datetime, until: datetime | None, actor: str | None,
          type_: str | None, format_: str, taken_by: str, now: datetime) -> Export:
    """Fix the export's range of ids and record who takes it (the caller commits before
    streaming): the ``audit_exported`` line comes after the range, so an export never
    holds its own line, and the next one of the same period does."""
    start = first_id_since(session, since)
    last = session.scalar(select(func.max(HistoryLine.id))) or 0
    stop = min(first_id_since(session, until), last + 1) if until else last + 1
    export = Export(since, until, actor, type_, format_, start, stop)
    add_line(session, None, "audit_exported", _describe(export, taken_by), actor=taken_by,
             data={"since": since.isoformat(), "until": until and until.isoformat(),
                   "actor": actor, "type": type_, "format": format_}, now=now)
    return export


def stream(engine: Engine, export: Export) -> Iterator[str]:
    """The export's text, a batch of lines at a time (CSV with a header row)."""
    if export.format == "csv":
        yield _csv_rows([COLUMNS])
    table = HistoryLine.__table__
    query = select(*(table.c[name] for name in COLUMNS)).where(
        table.c.id >= export.start, table.c.id < export.stop).order_by(table.c.id)
    if export.actor:
        query = query.where(table.c.actor == export.actor)
    if export.type:
        query = query.where(table.c.type == export.type)
    with engine.connect() as conn:
        result = conn.execution_options(yield_per=BATCH).execute(query)
        for batch in result.partitions():
            if export.format == "csv":
                yield _csv_rows([_csv_row(row) for row in batch])
            else:
                yield "".join(json.dumps(_json_row(row), ensure_ascii=False) + "\n"
                              for row in batch)


def _json_row(row) -> dict:
    line = dict(row._mapping)
    line["created_at"] = line["created_at"].isoformat() + "Z"
    return line


def _csv_row(row) -> list:
    line = _json_row(row)
    line["data"] = "" if line["data"] is None else json.dumps(line["data"],
                                                              ensure_ascii=False)
    return ["" if line[name] is None else line[name] for name in COLUMNS]


def _csv_rows(rows: list) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerows(rows)
    return out.getvalue()


def _describe(export: Export, taken_by: str) -> str:
    until = export.until.isoformat() + "Z" if export.until else "now"
    filters = "".join((f", actor {export.actor}" if export.actor else "",
                       f", type {export.type}" if export.type else ""))
    return (f"{taken_by}: exported the audit trail from {export.since.isoformat()}Z to "
            f"{until}{filters} as {export.format}")
