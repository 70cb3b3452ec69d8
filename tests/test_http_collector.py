"""The http_collector source against a real HTTP server on loopback, through the engine's
scan runner (its lease and intake): one message per change of the document, none for an
unchanged answer (ETag or Last-Modified) or a 204, the state kept across restarts."""

from __future__ import annotations

import base64
import threading
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from b2bhub.engine.scans import SourceRunner
from b2bhub.hub import new_session
from b2bhub.models import Message
from plugins.http_collector import HttpCollector

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
        self.seen: list[dict] = []

    def __call__(self, environ, start_response):
        request = Request(environ)
        self.seen.append(dict(request.headers))
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


@pytest.fixture
def document():
    doc = Document()
    server = make_server("127.0.0.1", 0, doc, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    doc.url = f"http://127.0.0.1:{server.server_port}/outbound/orders.xml"
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
    session.expire_all()
    rows = session.scalars(select(Message).order_by(Message.id)).all()
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


def test_a_failing_server_makes_no_message_and_says_why(collector, document, registry,
                                                        hub, clock, session):
    document.status = 503
    collector()
    report = scan(runner_of(registry, hub, clock), clock)
    assert "503" in report.reason and "down for maintenance" in report.reason
    assert bodies(session, hub) == []


def test_a_refused_connection_says_so(collector, registry, hub, clock, session):
    collector(url="http://127.0.0.1:9/nothing")
    report = scan(runner_of(registry, hub, clock), clock)
    assert "connection to 127.0.0.1:9 failed" in report.reason


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
