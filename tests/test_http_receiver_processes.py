"""http_receiver in real processes: gunicorn serving ``POST /in/<instance>``, a worker and
beat, an ``http_poster`` to a loopback destination. Async and sync intake end to end
(bodies byte-identical at the destination), sync attempts 1 s apart with the undelivered
message then delivered by the worker, one message for 20 concurrent requests with one
Idempotency-Key, and a chunked body cut off or a client gone mid-body storing nothing."""

from __future__ import annotations

import hashlib
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
from sqlalchemy import select

from b2bhub.models import Delivery, HistoryLine, Message
from plugins.http_poster import HttpPoster
from plugins.http_receiver import HttpReceiver
from tests.http_peer import Peer, Script
from tests.procs import wait_until
from tests.test_http_receiver import set_up_receivers

pytestmark = pytest.mark.processes


@pytest.fixture
def destination():
    server = Peer()
    yield server
    server.close()


@pytest.fixture
def hubprocs(procs, hub, session, registry, destination):
    """Web, worker and beat; the receivers ``inbox`` (async, routed to ``poster``) and
    ``direct`` (sync to ``poster``); returns (web url, tokens)."""
    registry.register(HttpReceiver)
    registry.register(HttpPoster)
    tokens = set_up_receivers(hub, session, destination.url("/in"), timeout=2, base_delay=3)
    # started together, then each waited for: their start-ups overlap
    started = [procs.web(wait=False), procs.worker(wait=False), procs.beat(wait=False)]
    for proc in started:
        proc.wait_ready()
    return started[0].url, tokens


def auth(token: str, **headers) -> dict:
    return {"Authorization": f"Bearer {token}", **headers}


def state(session, message_id: int) -> str | None:
    session.expire_all()
    return session.scalar(select(Delivery.state).where(Delivery.message_id == message_id))


def count(session) -> int:
    session.expire_all()
    return len(session.scalars(select(Message.id)).all())


def test_async_and_sync_end_to_end_byte_identical(hubprocs, session, destination):
    url, tokens = hubprocs
    body = os.urandom(300 * 1024)  # past the preread size: streamed into the store
    answer = requests.post(f"{url}/in/inbox", data=body, headers=auth(tokens["inbox"]),
                           timeout=30)
    assert answer.status_code == 202, answer.text
    message_id = answer.json()["message_id"]
    wait_until(lambda: state(session, message_id) == "delivered", 60, "async delivered")
    sync = requests.post(f"{url}/in/direct", data=body[:2048], headers=auth(tokens["direct"]),
                         timeout=30)
    assert sync.status_code == 200, sync.text
    assert sync.json()["outcome"] == "delivered"
    assert [s.sha256 for s in destination.seen] == [
        hashlib.sha256(body).hexdigest(), hashlib.sha256(body[:2048]).hexdigest()]


def test_sync_failure_three_attempts_a_second_apart_then_the_worker_delivers(
        hubprocs, session, destination):
    url, tokens = hubprocs
    destination.script("/in", Script(503), Script(503), Script(503), Script(200))
    answer = requests.post(f"{url}/in/direct", data=b"<order/>",
                           headers=auth(tokens["direct"]), timeout=60)
    assert answer.status_code == 502, answer.text
    message_id = answer.json()["message_id"]
    session.expire_all()
    started = [line.created_at for line in session.scalars(
        select(HistoryLine).where(HistoryLine.message_id == message_id,
                                  HistoryLine.type == "delivery_changed")
        .order_by(HistoryLine.id)) if "started" in line.text]
    gaps = [(b - a).total_seconds() for a, b in zip(started, started[1:], strict=False)]
    assert len(started) == 3 and all(0.95 <= g <= 2.5 for g in gaps), gaps
    assert state(session, message_id) == "retrying"
    # the worker and beat take it on the asynchronous path (due 3 s later)
    wait_until(lambda: state(session, message_id) == "delivered", 60, "async delivered")
    assert len(destination.seen) == 4


def test_twenty_concurrent_requests_with_one_key_make_one_message(hubprocs, session):
    url, tokens = hubprocs
    headers = auth(tokens["inbox"], **{"Idempotency-Key": "burst-1"})

    def post(_):
        return requests.post(f"{url}/in/inbox", data=b"<order n='1'/>", headers=headers,
                             timeout=30)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(post, range(20)))
    assert {a.status_code for a in answers} <= {202, 409}
    assert count(session) == 1
    ids = {a.json()["message_id"] for a in answers if a.status_code == 202}
    assert len(ids) == 1


def _raw(url: str, data: bytes) -> bytes:
    parsed = urlparse(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=15) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


def test_a_cut_chunked_body_and_a_client_gone_store_nothing(hubprocs, session, app):
    url, tokens = hubprocs
    head = (b"POST /in/inbox HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + tokens["inbox"].encode())
    chunked = _raw(url, head + b"\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n"
                   + b"a" * 1024 + b"\r\n400\r\n" + b"b" * 100)
    gone = _raw(url, head + b"\r\nContent-Length: 500000\r\n\r\n" + b"c" * 100000)
    for answer in (chunked, gone):
        # an answer that says what happened, or none at all to a client that left
        assert answer == b"" or answer.split(b" ", 2)[1] in (b"400", b"503"), answer[:300]
    assert count(session) == 0
    root = Path(app.config["PAYLOAD_DIR"])
    left = [p for p in root.rglob("*") if p.is_file() and p.name != "store.lock"]
    assert left == []
