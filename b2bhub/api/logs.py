"""``GET /logs``: log records of every connected process, newest first, or as a stream.

Filters: ``level`` (a name such as ``warning``: that level and above), ``process``
(a process id, or a kind: ``web``, ``worker``, ``beat``). Pages with ``limit`` and
``cursor``. ``GET /logs/stream`` sends the records as Server-Sent Events (event
``log``, id the record id) from ``Last-Event-ID`` / ``?after=``, or from now.
"""

from __future__ import annotations

import logging

from flask import jsonify, request

from b2bhub.api import bp
from b2bhub.api.events import open_stream, resume_point
from b2bhub.api.inputs import bad_request, cursor_arg, limit_arg, text_arg
from b2bhub.api.shapes import iso, page_json
from b2bhub.engine import presence
from b2bhub.engine.events import IdFeed
from b2bhub.extensions import db
from b2bhub.models import LogRecord
from b2bhub.services.streams import sse_event


@bp.get("/logs")
def list_logs():
    page = presence.list_log_records(db.session, _filters(), limit_arg(), cursor_arg(int))
    return jsonify(page_json(page, log_json))


@bp.get("/logs/stream")
def stream_logs():
    filters = _filters()
    after = resume_point()
    if after is None:
        after = presence.latest_log_id(db.session)

    def read(conn, after_id: int, limit: int) -> list[dict]:
        table = LogRecord.__table__
        rows = conn.execute(db.select(table).where(table.c.id > after_id)
                            .order_by(table.c.id).limit(limit))
        return [log_json(row) for row in rows]

    def keep(item: dict) -> bool:
        return item["level_no"] >= filters.min_level and (
            not filters.process or filters.process in (item["process_id"], item["kind"]))

    feed = IdFeed(read, after, keep)
    return open_stream(db.engine, lambda conn: [sse_event(item["id"], "log", item)
                                                for item in feed.poll(conn)])


def _filters() -> presence.LogFilter:
    level = request.args.get("level", "")
    try:
        min_level = presence.level_number(level) if level else 0
    except ValueError:
        raise bad_request("level must be a log level: debug, info, warning, error or "
                          "critical", "level") from None
    return presence.LogFilter(min_level=min_level, process=text_arg("process"))


def log_json(row: LogRecord) -> dict:
    return {"id": row.id, "created_at": iso(row.created_at),
            "level": logging.getLevelName(row.level).lower(), "level_no": row.level,
            "logger": row.logger,
            "message": row.message, "process_id": row.process_id, "kind": row.kind,
            "host": row.host, "pid": row.pid}

