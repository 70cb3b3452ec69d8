"""The http_collector source against a real HTTP server on loopback, through the engine's
scan runner (its lease and intake): one message per change of the document, none for an
unchanged answer (ETag or Last-Modified) or a 204, the state kept across restarts; a
failed fetch (refused connection, timeout, error answer, a body that breaks off) is a
Collection error message with the ``message_failed`` alert, one per failure episode,
listed apart from delivery errors."""

from __future__ import annotations

import base64
import re
import socket
import threading
import time
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.engine.scans import SourceRunner
from b2bhub.models import Alert, Delivery, HistoryLine, Message, Payload, utcnow
from b2bhub.runtime.hub import new_session
from b2bhub.services.config import get_instance, save_instance
from b2bhub.services.users import create_user
from plugins.http_collector import HttpCollector
from tests.loopback import serve_in_thread
from tests.procs import free_port
from tests.test_ui import PASSWORD

T0 = datetime(2030, 1, 1, 12, 0, 0)


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Document:
    """Serves one document with a validator; records the requests' headers."""

    def __init__(self):
        self.body, self.version, self.status = b"<orders n='1'/>", 1, 200
        self.validator = "etag"
        self.delay = 0.0  # seconds before answering
        self.seen: list[dict] = []

    def __call__(self, environ, start_response):
        request = Request(environ)
        self.seen.append(dict(request.headers))
        time.sleep(self.delay)
        if self.status != 200:
            return Response("down for maintenance", status=self.status)(environ,
                                                                      start_response)
        if self.body == b"":
            return Response(status=204)(environ, start_response)
        etag = f'"v{self.version}"'
        stamp = f"Tue, 01 Dec 2026 10:00:{self.version:02d} GMT"
        if self.validator == "etag" and request.headers.get("If-None-Match") == etag:
            return Response(status=304)(environ, start_response)
        if (self.validator == "last_modified"
                and request.headers.get("If-Modified-Since") == stamp):
            return Response(status=304)(environ, start_response)
        answer = Response(self.body, content_type="application/xml")
        if self.validator == "etag":
            answer.headers["ETag"] = etag
        else:
            answer.headers["Last-Modified"] = stamp
        return answer(environ, start_response)

    def change(self, body: bytes) -> None:
        self.body, self.version = body, self.version + 1


def serve(doc: Document):
    """Serve ``doc`` on a loopback port of its own and set its ``url``; the server (to
    shut down)."""
    server = make_server("127.0.0.1", 0, doc, threaded=True)
    serve_in_thread(server)
    doc.url = f"http://127.0.0.1:{server.server_port}/outbound/orders.xml"
    return server


@pytest.fixture
def document():
    doc = Document()
    server = serve(doc)
    yield doc
    server.shutdown()


@pytest.fixture
def registry(registry):
    registry.register(HttpCollector)
    return registry


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def collector(hub, document):
    def make(**config):
        hub.parties(organizations=("mycompany",), partners=("acme",))
        return hub.instance("collect", "http_collector", config={
            "url": document.url, "from": "acme", "to": "mycompany",
            "polling_interval": 10, **config})
    return make


def runner_of(registry, hub, clock):
    return SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock)


def bodies(session, hub) -> list[bytes]:
    """The collected documents, oldest first (collection errors have none)."""
    session.expire_all()
    rows = session.scalars(select(Message).where(
        Message.status != "collection_error").order_by(Message.id)).all()
    return [hub.store.open(m.sha256).read() for m in rows]


def scan(runner, clock):
    report = runner.scan("collect")
    clock.advance(10)
    return report


@pytest.mark.parametrize("validator", ["etag", "last_modified"])
def test_one_message_per_change_of_the_document(collector, document, registry, hub,
                                                clock, session, validator):
    document.validator = validator
    collector()
    runner = runner_of(registry, hub, clock)
    assert scan(runner, clock).messages
    scan(runner, clock)
    scan(runner, clock)
    assert bodies(session, hub) == [b"<orders n='1'/>"]
    document.change(b"<orders n='2'/>")
    scan(runner, clock)
    scan(runner, clock)
    assert bodies(session, hub) == [b"<orders n='1'/>", b"<orders n='2'/>"]
    header = "If-None-Match" if validator == "etag" else "If-Modified-Since"
    assert header in document.seen[1]
    session.expire_all()
    message = session.scalars(select(Message).order_by(Message.id)).first()
    assert (message.source, message.from_party, message.to_party,
            message.original_filename) == ("collect", "acme", "mycompany", "orders.xml")


def test_the_validator_survives_a_restart(collector, document, registry, hub, clock,
                                          session):
    collector()
    scan(runner_of(registry, hub, clock), clock)
    scan(runner_of(registry, hub, clock), clock)  # a new process: a new plugin object
    assert len(bodies(session, hub)) == 1


def test_an_empty_204_makes_no_message(collector, document, registry, hub, clock, session):
    document.body = b""
    collector()
    report = scan(runner_of(registry, hub, clock), clock)
    assert report.ran and not report.messages
    assert bodies(session, hub) == []


def test_fixed_headers_and_basic_auth_go_out(collector, document, registry, hub, clock):
    collector(headers={"X-Api": "7"}, auth="basic", username="hub", password="s3cret")
    scan(runner_of(registry, hub, clock), clock)
    sent = document.seen[0]
    assert sent["X-Api"] == "7"
    assert sent["Authorization"] == "Basic " + base64.b64encode(b"hub:s3cret").decode()


def test_bearer_auth_goes_out(collector, document, registry, hub, clock):
    collector(auth="bearer", token="tok-1")
    scan(runner_of(registry, hub, clock), clock)
    assert document.seen[0]["Authorization"] == "Bearer tok-1"


# --- failed fetches ------------------------------------------------------------------

def collection_errors(session) -> list[Message]:
    session.expire_all()
    return session.scalars(select(Message).where(
        Message.status == "collection_error").order_by(Message.id)).all()


def history(session, message_id: int) -> list[tuple[str, str]]:
    return [(line.type, line.text) for line in session.scalars(
        select(HistoryLine).where(HistoryLine.message_id == message_id)
        .order_by(HistoryLine.id))]


def open_alerts(session) -> list[tuple[str, int | None]]:
    """The open ``message_failed`` alerts (the documents collected have no route here:
    their ``message_not_routed`` alerts are not counted)."""
    session.expire_all()
    return [(a.kind, a.message_id) for a in session.scalars(
        select(Alert).where(Alert.resolved_at.is_(None), Alert.kind == "message_failed")
        .order_by(Alert.id))]


class BrokenBody:
    """A server that promises 1000 bytes and closes the connection after 20."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/orders.xml"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n"
                             b"Content-Type: application/xml\r\n\r\n<orders n='1'>")


def refused(document) -> dict:
    return {"url": f"http://127.0.0.1:{free_port()}/outbound/orders.xml"}


def too_slow(document) -> dict:
    document.delay = 1.5
    return {"timeout": 0.3}


def answers_500(document) -> dict:
    document.status = 500
    return {}


@pytest.mark.parametrize(("breaks", "says"), [
    (refused, r"connection to 127\.0\.0\.1:\d+ failed: .*[Rr]efused"),
    (too_slow, r"no answer from http://127\.0\.0\.1:\d+/outbound/orders\.xml within 0\.3 s"),
    (answers_500, r"GET http://\S+ answered 500 INTERNAL SERVER ERROR: down for maintenance"),
], ids=["connection refused", "timeout", "500"])
def test_a_failed_fetch_records_a_collection_error_and_raises_message_failed(
        collector, document, registry, hub, clock, session, breaks, says):
    collector(**breaks(document))
    report = scan(runner_of(registry, hub, clock), clock)
    assert re.search(says, report.reason), report.reason
    [message] = collection_errors(session)
    assert re.fullmatch(says, message.status_text), message.status_text
    assert (message.source, message.from_party, message.to_party, message.direction,
            message.original_filename) == ("collect", "acme", "mycompany", "inbound",
                                           "orders.xml")
    assert (message.sha256, message.size) == (None, 0)
    assert session.scalars(select(Payload)).all() == []
    assert session.scalars(select(Delivery)).all() == []
    assert [t for t, _ in history(session, message.id)] == ["collection_failed",
                                                            "status_changed"]
    assert history(session, message.id)[0][1] == message.status_text
    [alert] = session.scalars(select(Alert)).all()
    assert (alert.kind, alert.subject, alert.message_id, alert.resolved_at) == (
        "message_failed", f"message:{message.id}", message.id, None)
    assert "collect could not collect" in alert.text
    assert bodies(session, hub) == []


def test_an_answer_that_breaks_off_is_a_collection_error_and_keeps_nothing(
        collector, registry, hub, clock, session):
    server = BrokenBody()
    try:
        collector(url=server.url, timeout=2)
        scan(runner_of(registry, hub, clock), clock)
    finally:
        server.sock.close()
    [message] = collection_errors(session)
    assert message.status_text.startswith(f"the answer from {server.url} broke off")
    assert session.scalars(select(Payload)).all() == []
    assert list(hub.store.root.rglob("put-*")) == []  # no temp file left behind
    assert open_alerts(session) == [("message_failed", message.id)]


def test_a_server_that_stays_down_makes_one_message_until_a_fetch_succeeds(
        collector, document, registry, hub, clock, session):
    collector()
    runner = runner_of(registry, hub, clock)
    scan(runner, clock)
    assert bodies(session, hub) == [b"<orders n='1'/>"]
    document.status = 500
    first_failure = clock.now
    for _ in range(5):
        scan(runner, clock)
    [message] = collection_errors(session)
    assert message.status_text == (
        f"GET {document.url} answered 500 INTERNAL SERVER ERROR: down for maintenance "
        f"(5 failed fetches since {first_failure:%Y-%m-%d %H:%M:%S} UTC)")
    assert [t for t, _ in history(session, message.id)] == ["collection_failed",
                                                            "status_changed"]
    assert open_alerts(session) == [("message_failed", message.id)]

    document.status = 503  # a new reason: a line of its own
    scan(runner, clock)
    clock.advance(3600)  # the same reason an hour later: one line, not one per poll
    scan(runner, clock)
    scan(runner, clock)
    assert len(collection_errors(session)) == 1
    lines = history(session, message.id)
    assert [t for t, _ in lines] == ["collection_failed", "status_changed",
                                     "collection_failed", "collection_failed"]
    assert "failed fetch 6 since" in lines[2][1] and "answered 503" in lines[2][1]
    assert "failed fetch 7 since" in lines[3][1]
    assert "(8 failed fetches since" in collection_errors(session)[0].status_text

    document.status = 200  # back, with the document unchanged: a 304 ends the episode
    scan(runner, clock)
    assert bodies(session, hub) == [b"<orders n='1'/>"]  # the ETag was kept meanwhile
    assert history(session, message.id)[-1] == (
        "collection_recovered", f"collect fetched again after 8 failed fetches since "
        f"{first_failure:%Y-%m-%d %H:%M:%S} UTC")
    assert open_alerts(session) == []
    [alert] = session.scalars(select(Alert).where(Alert.kind == "message_failed")).all()
    assert alert.resolved_at is not None
    assert collection_errors(session)[0].status == "collection_error"  # the record stays
    scan(runner, clock)  # a further success adds nothing
    assert len(history(session, message.id)) == 5

    document.status = 500  # a new episode: a new message and a new alert
    scan(runner, clock)
    first, second = collection_errors(session)
    assert first.id == message.id
    assert open_alerts(session) == [("message_failed", second.id)]
    document.status = 200
    document.change(b"<orders n='2'/>")
    scan(runner, clock)
    assert bodies(session, hub) == [b"<orders n='1'/>", b"<orders n='2'/>"]
    assert open_alerts(session) == []


def test_an_instance_retry_policy_retries_a_503_and_records_a_404_at_once(
        collector, document, registry, hub, clock, session):
    """Its rules see the error class: a down server is tried twice more, sooner than
    the 10 s schedule; a missing document is recorded at the first fetch."""
    collector()
    save_instance(session, registry, {"retry_policy": {
        "max_attempts": 3, "strategy": "fixed", "base_delay": 4,
        "rules": [{"match": "http_4xx", "action": "fail"}]}},
        existing=get_instance(session, "collect"), actor="tests")
    session.commit()
    runner = runner_of(registry, hub, clock)
    document.status = 503
    for _ in range(2):
        report = runner.scan("collect")
        assert report.retry_at == clock.now + timedelta(seconds=4)
        clock.advance(4)
    assert collection_errors(session) == [] and open_alerts(session) == []
    runner.scan("collect")
    [message] = collection_errors(session)
    assert "(3 failed fetches since" in message.status_text
    document.status = 200
    clock.advance(10)
    runner.scan("collect")  # the episode ends; the alert is resolved
    assert open_alerts(session) == []

    document.status = 404
    clock.advance(10)
    report = runner.scan("collect")
    assert report.retry_at is None
    assert len(collection_errors(session)) == 2
    assert "answered 404" in collection_errors(session)[-1].status_text
    assert open_alerts(session) == [("message_failed", collection_errors(session)[-1].id)]


def test_the_episode_survives_a_restart(collector, document, registry, hub, clock, session):
    document.status = 500
    collector()
    scan(runner_of(registry, hub, clock), clock)
    scan(runner_of(registry, hub, clock), clock)  # a new process: a new plugin object
    [message] = collection_errors(session)
    assert "(2 failed fetches since" in message.status_text


def test_collection_errors_are_listed_apart_from_delivery_errors(
        collector, document, registry, hub, clock, session, app, api, record_dir):
    document.status = 500
    collector()
    scan(runner_of(registry, hub, clock), clock)
    [collected] = collection_errors(session)
    # and a delivery that failed, for the other side of the line
    hub.instance("inbox", "manual_source")
    hub.instance("writer", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer")
    failed = hub.message(filename="order-7.edi")
    [claim] = claiming.claim(session, "writer", "w1", utcnow(), 1, 300)
    settlement.settle(session, claim, Outcome.failed("disk full"), RetryPolicy(), utcnow())
    session.commit()

    def listed(status):
        answer = api.get(f"/api/v1/messages?status={status}")
        assert answer.status_code == 200, answer.text
        return [m["id"] for m in answer.json["items"]]

    assert listed("collection_error") == [collected.id]
    assert listed("error") == [failed.id]
    stats = api.get("/api/v1/stats").json["messages"]["by_status"]
    assert (stats["collection_error"], stats["error"]) == (1, 1)

    create_user(session, "vera", PASSWORD, "viewer")
    session.commit()
    ui = app.test_client()
    assert ui.post("/ui/login", data={"name": "vera", "password": PASSWORD}).status_code == 302
    page = ui.get("/ui/delivery-errors").text
    rows = re.findall(r'<tr data-delivery="\d+">.*?</tr>', page, re.S)
    assert len(rows) == 1 and f"/ui/messages/{failed.id}\"" in rows[0]
    assert "disk full" in rows[0]
    assert f"/ui/messages/{collected.id}\"" not in page
    note = re.search(r'<p class="muted" id="collection-errors">.*?</p>', page).group(0)
    assert 'href="/ui/messages?status=collection_error">1 collection error</a>' in note
    dashboard = ui.get("/ui/").text
    card = re.search(r'<div class="card" data-status="collection_error">.*?</a></div>',
                     dashboard, re.S)
    assert card, dashboard
    assert 'href="/ui/messages?status=collection_error"' in card.group(0)
    assert '<div class="n">1</div>' in card.group(0) and "Collection error" in card.group(0)
    listing = ui.get("/ui/messages?status=collection_error").text
    assert f"/ui/messages/{collected.id}" in listing
    assert f"/ui/messages/{failed.id}\"" not in listing
    shown = ui.get(f"/ui/messages/{collected.id}").text
    assert "answered 500" in shown and "down for maintenance" in shown
