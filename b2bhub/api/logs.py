"""``GET /logs``: log records of every connected process, newest first, or as a stream.

Filters: ``level`` (a name such as ``warning``: that level and above), ``process``
(a process id, or a kind: ``web``, ``worker``, ``beat``). Pages with ``limit`` and
``cursor``. ``GET /logs/stream`` sends the records as Server-Sent Events (event
``log``, id the record id) from ``Last-Event-ID`` / ``?after=``, or from now.
"""

from __future__ import annotations

import logging

import b2bhub.api.schemas as s
from b2bhub.api.blueprint import bp
from b2bhub.api.events import open_stream, resume_point, sse_doc
from b2bhub.api.shapes import iso
from b2bhub.config.extensions import db
from b2bhub.engine import presence
from b2bhub.engine.events import IdFeed
from b2bhub.models import LogRecord
from b2bhub.services.streams import sse_event


@bp.get("/logs", summary="List log records")
@bp.arguments(s.LogArgs, location="query")
@bp.response(200, s.LogPage)
def list_logs(args: dict):
    """Newest first."""
    page = presence.list_log_records(db.session, _filters(args), args["limit"],
                                     args.get("cursor"))
    return {"items": [log_json(row) for row in page.items],
            "next_cursor": s.encode_cursor(page.next_key)}


@bp.get("/logs/stream", summary="Stream log records (Server-Sent Events)",
        refusals=(503,))
@bp.arguments(s.LogStreamArgs, location="query")
@bp.doc(responses={200: sse_doc("log", "LogRecord", "log")})
def stream_logs(args: dict):
    """Event ``log``, id the record id, data a log record as JSON; from
    ``Last-Event-ID`` (or ``?after=``), else from now."""
    filters = _filters(args)
    after = resume_point()
    if after is None:
        after = presence.latest_log_id(db.session)

    def read(conn, after_id: int, limit: int) -> list[dict]:
        table = LogRecord.__table__
        rows = conn.execute(db.select(table).where(table.c.id > after_id)
                            .order_by(table.c.id).limit(limit))
        return [log_json(row, iso) for row in rows]

    def keep(item: dict) -> bool:
        return item["level_no"] >= filters.min_level and (
            not filters.process or filters.process in (item["process_id"], item["kind"]))

    feed = IdFeed(read, after, keep)
    return open_stream(db.engine, lambda conn: [sse_event(item["id"], "log", item)
                                                for item in feed.poll(conn)])


def _filters(args: dict) -> presence.LogFilter:
    level = args.get("level")
    return presence.LogFilter(min_level=presence.level_number(level) if level else 0,
                              process=args.get("process") or None)


def log_json(row: LogRecord, moment=lambda m: m) -> dict:
    return {"id": row.id, "created_at": moment(row.created_at),
            "level": logging.getLevelName(row.level).lower(), "level_no": row.level,
            "logger": row.logger,
            "message": row.message, "process_id": row.process_id, "kind": row.kind,
            "host": row.host, "pid": row.pid}
