"""``GET /events``: history lines as Server-Sent Events (SPEC 16).

The event id is the history line id; a client that reconnects with ``Last-Event-ID``
(or ``?after=<id>``) gets every line after it once, in id order (see
``b2bhub.engine.events``). Without either, the stream starts with the lines committed
after it opened. Filters: ``message=<id>``, ``type=a,b``.
"""

from __future__ import annotations

import threading

from flask import Response, current_app, request

import b2bhub.api.schemas as s
from b2bhub.api.blueprint import bp
from b2bhub.api.errors import ApiError
from b2bhub.api.inputs import bad_request, int_arg, list_arg
from b2bhub.config.extensions import db
from b2bhub.engine.events import FeedFilter, latest_id
from b2bhub.services.livefeed import SharedFeed, history_stream
from b2bhub.services.streams import StreamSlots, poll_stream

_lock = threading.Lock()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_doc(event: str, schema: str, example_event: str) -> dict:
    """The document's answer of a stream: text/event-stream, a text of events whose
    ``data:`` lines are each a JSON object of ``schema`` (components.schemas, also named
    by ``x-event-data``: OpenAPI 3.0 has no field for an event's own schema)."""
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"description": f"Server-Sent Events: ``event: {event}``, ``id:`` to resume "
            f"from, ``data:`` one {schema} object as JSON (its schema: ``x-event-data``); "
            f"a comment line every 15 s keeps the stream open",
            "content": {"text/event-stream": {
                "schema": {"type": "string", "x-event-data": ref},
                "example": f"id: 42\nevent: {example_event}\ndata: {{...a {schema}...}}"
                           "\n\n"}}}


@bp.get("/events", summary="Stream history lines (Server-Sent Events)", refusals=(503,))
@bp.arguments(s.EventArgs, location="query")
@bp.doc(responses={200: sse_doc("the history line's type", "HistoryEvent", "received")})
def stream_events(args: dict):
    """A client that reconnects with ``Last-Event-ID`` (or ``?after=<id>``) gets every
    line after it once, in id order; without either, the stream starts with the lines
    committed after it opened."""
    after = resume_point()
    filters = FeedFilter(message_id=int_arg("message"), types=list_arg("type") or [])
    engine = db.engine
    if after is None:
        with engine.connect() as conn:
            after = latest_id(conn)
    cfg = current_app.config
    body = history_stream(shared_feed(), engine, after, filters,
                          every=cfg.get("STREAM_POLL_SECONDS", 0.5),
                          keepalive=cfg.get("STREAM_KEEPALIVE_SECONDS", 15.0))
    return stream_response(body)


def shared_feed() -> SharedFeed:
    """The process's one reader of history lines, started with the first stream."""
    app = current_app
    with _lock:
        if "b2bhub.shared_feed" not in app.extensions:
            app.extensions["b2bhub.shared_feed"] = SharedFeed(
                db.engine, every=app.config.get("STREAM_POLL_SECONDS", 0.5) / 2).start()
    return app.extensions["b2bhub.shared_feed"]


def open_stream(engine, poll) -> Response:
    """A text/event-stream response polling ``poll`` on its own, if a slot is free."""
    cfg = current_app.config
    return stream_response(poll_stream(
        engine, poll, every=cfg.get("STREAM_POLL_SECONDS", 0.5),
        keepalive=cfg.get("STREAM_KEEPALIVE_SECONDS", 15.0)))


def stream_response(body) -> Response:
    """A text/event-stream response sending ``body``, if a stream slot is free."""
    slots = stream_slots()
    if not slots.take():
        raise ApiError(503, "too_many_streams",
                       f"this web process serves at most {slots.size} streams at once; "
                       "retry later or start another web process")
    response = Response(body, mimetype="text/event-stream", headers=SSE_HEADERS)
    response.call_on_close(slots.give_back)  # also when the body was never started
    return response


def stream_slots() -> StreamSlots:
    app = current_app
    if "b2bhub.stream_slots" not in app.extensions:
        app.extensions["b2bhub.stream_slots"] = StreamSlots.for_threads(
            app.config["WEB_THREADS"])
    return app.extensions["b2bhub.stream_slots"]


def resume_point() -> int | None:
    value = request.headers.get("Last-Event-ID") or request.args.get("after")
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit()):  # "²".isdigit() too, which int() refuses
        raise bad_request("Last-Event-ID (or after) must be a history line id", "after")
    return int(value)
