"""``GET /api/v1/events``: history lines as Server-Sent Events.

In-process checks (filters, resume point, keep-alive, roles) use Flask's test client;
the contract that matters, every line once and in order across reconnects while
messages flow, is shown with a real SSE client against a real gunicorn on loopback,
with real workers settling deliveries while the test process stores messages from
several threads.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from httpx_sse import connect_sse
from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
from b2bhub.engine.events import history_feed, latest_id
from b2bhub.models import Delivery, HistoryLine, utcnow
from b2bhub.runtime.hub import CeleryPublisher
from b2bhub.services.tokens import create_token
from tests.procs import wait_until


def read_events(response, count: int) -> list[tuple[str, str, dict]]:
    """The first ``count`` events of a streamed test-client response (id, type, data)."""
    events, buffer = [], ""
    for chunk in response.response:
        buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.splitlines()
                          if not line.startswith(":") and ": " in line)
            if "data" in fields:
                events.append((fields["id"], fields["event"], json.loads(fields["data"])))
            if len(events) == count:
                response.close()
                return events
    return events


@pytest.fixture
def fast_streams(app):
    app.config.update(STREAM_POLL_SECONDS=0.01, STREAM_KEEPALIVE_SECONDS=0.05)


def test_events_resume_after_the_given_id_with_each_line_once(api, hub, fast_streams):
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("out", "noop")
    hub.route("inbox", "*", "*", "out")
    first, second = hub.message(), hub.message()
    lines = [row.id for row in db.session.scalars(select(HistoryLine).order_by(HistoryLine.id))]

    events = read_events(api.get("/api/v1/events?after=0"), len(lines))
    assert [int(e[0]) for e in events] == lines
    some = events[0][2]
    assert set(some) == {"id", "message_id", "delivery_id", "type", "text", "actor",
                         "created_at", "message_status", "message_status_code"}
    assert some["message_id"] == first.id and some["message_status"] == first.status
    assert some["message_status_code"] == "ENFILEIRADA"  # received: queued (docs/status-codes.md)
    assert events[0][1] == some["type"]

    resumed = read_events(api.get("/api/v1/events", headers={"Last-Event-ID": lines[2]}),
                          len(lines) - 3)
    assert [int(e[0]) for e in resumed] == lines[3:]

    only = read_events(api.get(f"/api/v1/events?after=0&message={second.id}&type=received"),
                       1)
    assert [(e[2]["message_id"], e[1]) for e in only] == [(second.id, "received")]


def test_events_start_now_without_a_resume_point_and_send_keep_alives(api, hub, fast_streams):
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.message()
    response = api.get("/api/v1/events")
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    chunks = iter(response.response)
    assert next(chunks) == b": connected\n\n"
    assert next(chunks) == b": keep-alive\n\n"  # nothing old is replayed
    newer = hub.message()
    event = next(chunks).decode()
    assert f'"message_id":{newer.id}' in event and "event: received" in event
    response.close()


def test_events_refuse_a_bad_resume_point_and_callers_without_a_token(api, client, app,
                                                                    session):
    bad = api.get("/api/v1/events", headers={"Last-Event-ID": "abc"})
    assert bad.status_code == 400 and bad.get_json()["error"]["details"] == {
        "after": "Last-Event-ID (or after) must be a history line id"}
    assert client.get("/api/v1/events").status_code == 401
    viewer = app.test_client()
    viewer.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {create_token(session, 'v', 'viewer')}"
    session.commit()
    response = viewer.get("/api/v1/events?after=0")
    assert response.status_code == 200
    response.close()


def test_streams_beyond_the_slots_are_refused_and_a_closed_one_frees_its_slot(
        api, app, fast_streams):
    app.config["WEB_THREADS"] = 6  # 2 stream slots
    open_ = [api.get("/api/v1/events") for _ in range(2)]
    refused = api.get("/api/v1/events")
    assert refused.status_code == 503
    assert refused.get_json()["error"]["code"] == "too_many_streams"
    open_[0].close()
    again = api.get("/api/v1/events")
    assert again.status_code == 200
    for response in (open_[1], again):
        response.close()


# --- the feed on the database: a missing id holds the lines after it back -----------------

def test_a_line_committed_late_with_a_lower_id_is_not_skipped(app, hub, session):
    """The transaction holding the lower id commits after the one holding the higher:
    the feed must not move past the missing id while its transaction runs (on
    PostgreSQL the higher line is visible first and waits; on SQLite the second writer
    waits for the first)."""
    engine = db.engine
    feed = history_feed(0)
    slow = Session(engine)
    slow.add(HistoryLine(type="note", text="slow"))
    slow.flush()  # draws the lower id, not yet committed

    def commit_fast() -> None:
        with Session(engine) as fast:
            fast.add(HistoryLine(type="note", text="fast"))
            fast.commit()

    fast = threading.Thread(target=commit_fast)
    fast.start()
    fast.join(timeout=1)
    for _ in range(3):  # see the gap, find its transaction running, look again
        with engine.connect() as conn:
            assert feed.poll(conn) == []
    slow.commit()
    fast.join()
    with engine.connect() as conn:
        assert [line["text"] for line in feed.poll(conn)] == ["slow", "fast"]


def test_an_id_of_a_rolled_back_transaction_is_stepped_over(app):
    engine = db.engine
    feed = history_feed(0)
    with Session(engine) as lost:
        lost.add(HistoryLine(type="note", text="lost"))
        lost.flush()  # draws an id (PostgreSQL) that will never be visible
        lost.rollback()
    with Session(engine) as kept:
        kept.add(HistoryLine(type="note", text="kept"))
        kept.commit()
    seen: list[str] = []
    for _ in range(3):  # see the gap, learn it is dead, read again
        with engine.connect() as conn:
            seen += [line["text"] for line in feed.poll(conn)]
    assert seen == ["kept"]


# --- a real client over a real gunicorn while messages flow --------------------------------

def test_sse_client_resumes_three_times_and_gets_every_line_once_in_order(
        procs, app, hub, session, record_dir):
    n, threads = 500, 4
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("recorder", "recorder", config={"record_dir": str(record_dir)},
                 max_concurrent_deliveries=4)
    hub.route("inbox", "*", "*", "recorder")
    token = create_token(session, "sse", "viewer")
    session.commit()
    wakeup_module.set_publisher(CeleryPublisher(app).publish)
    for _ in range(2):
        procs.worker(wait=False)
    web = procs.web()
    for proc in procs.procs:
        if proc.name.startswith("worker"):
            proc.wait_in_log(" ready.", timeout=60)

    stored = hub.store.put(b"ISA*00*events~")

    def intake(part: int) -> None:
        with app.app_context(), Session(db.engine, expire_on_commit=False) as s:
            for i in range(part, n, threads):
                store_and_dispatch(s, NewMessage(
                    source="inbox", from_party="acme", to_party="mycompany",
                    stages={"unpacked": (stored.digest, stored.size)},
                    external_id=f"m{i}"), utcnow())
                s.commit()

    senders = [threading.Thread(target=intake, args=(p,)) for p in range(threads)]
    for sender in senders:
        sender.start()

    received: list[int] = []
    last_id = "0"
    headers = {"Authorization": f"Bearer {token}"}
    cut_at = [300, 900, 1600]  # three disconnects while the messages flow

    def everything_received() -> bool:
        with Session(db.engine) as s:
            done = s.scalar(select(db.func.count()).select_from(Delivery).where(
                Delivery.state == "delivered")) == n
            top = s.scalar(select(db.func.max(HistoryLine.id)))
        return done and received and received[-1] == top

    with httpx.Client(base_url=web.url, timeout=httpx.Timeout(5, read=30)) as http:
        for round_ in range(len(cut_at) + 1):
            with connect_sse(http, "GET", "/api/v1/events",
                             params={"after": last_id} if round_ == 0 else None,
                             headers={**headers, "Last-Event-ID": last_id}) as source:
                assert source.response.status_code == 200
                for sse in source.iter_sse():
                    if not sse.data:  # a keep-alive (httpx-sse repeats the last id)
                        continue
                    received.append(int(sse.id))
                    last_id = sse.id
                    assert json.loads(sse.data)["id"] == int(sse.id)
                    if round_ < len(cut_at) and len(received) >= cut_at[round_]:
                        break
                    if round_ == len(cut_at) and everything_received():
                        break
    for sender in senders:
        sender.join()
    wait_until(everything_received, 60, "every line received")

    with Session(db.engine) as s:
        stored_ids = list(s.scalars(select(HistoryLine.id).order_by(HistoryLine.id)))
    assert len(stored_ids) >= 4 * n
    assert len(received) == len(set(received)), "a line came twice"
    assert received == sorted(received), "lines out of order"
    assert received == stored_ids, "a line was lost"
    assert web.alive()


def test_a_stream_behind_the_shared_buffer_reads_the_database_then_switches_over(app):
    """Streams share one reader that keeps the newest lines; one resuming from further
    back reads the database until it has caught up. Every line comes once, in order."""
    from b2bhub.engine.events import FeedFilter
    from b2bhub.services.livefeed import SharedFeed, history_stream

    engine = db.engine

    def add_notes(count: int) -> None:
        with Session(engine) as s:
            for i in range(count):
                s.add(HistoryLine(type="note", text=f"note {i}"))
                s.commit()

    add_notes(10)
    shared = SharedFeed(engine, every=0.01, keep=2).start()
    stream = history_stream(shared, engine, 0, FeedFilter(), every=0.01, keepalive=0.05)
    ids: list[int] = []
    for chunk in stream:
        ids += [int(line[4:]) for line in chunk.splitlines() if line.startswith("id: ")]
        if len(ids) == 10:
            add_notes(8)  # the shared buffer keeps 2 to 4 of these
        if len(ids) >= 18:
            break
    stream.close()
    shared.stop()
    assert ids == list(range(1, 19))


def test_a_stopped_shared_feed_reads_no_more_until_read_again(app):
    """An app torn down stops its reader (``tests/conftest.py``): a read still running
    when the next test emptied the tables deadlocked with it."""
    from b2bhub.services.livefeed import SharedFeed

    shared = SharedFeed(db.engine, every=0.01).start()
    [reader] = [t for t in threading.enumerate() if t.name == "b2bhub-shared-feed"]
    time.sleep(0.05)  # a few reads
    shared.stop()
    assert not reader.is_alive()
    assert [t for t in threading.enumerate() if t.name == "b2bhub-shared-feed"] == []

    with db.engine.connect() as conn:
        newest = latest_id(conn)
    assert shared.read(newest, wait=0) == []  # starts it again, from the newest line
    with Session(db.engine) as s:
        s.add(HistoryLine(type="note", text="after the restart"))
        s.commit()
    deadline, entries = time.monotonic() + 5, []
    while not entries and time.monotonic() < deadline:
        entries = shared.read(newest, wait=0.1)
    assert [row["text"] for _, row, _ in entries] == ["after the restart"]
    shared.stop()


def test_each_event_is_the_object_the_document_describes(api, hub, fast_streams):
    """The document names each event's data schema (``x-event-data``), and every event
    sent is an object of it."""
    from openapi_schema_validator import OAS30Validator

    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("out", "noop")
    hub.route("inbox", "*", "*", "out")
    hub.message()
    doc = api.get("/api/v1/openapi.json").json
    stream = doc["paths"]["/api/v1/events"]["get"]["responses"]["200"]["content"]
    ref = stream["text/event-stream"]["schema"]["x-event-data"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    validator = OAS30Validator(schema)
    events = read_events(api.get("/api/v1/events?after=0"), 2)
    assert len(events) == 2
    for _id, _type, data in events:
        validator.validate(data)
        assert set(data) == set(schema["properties"])
    assert not OAS30Validator(schema).is_valid({**events[0][2], "message_status_code": "X"})
