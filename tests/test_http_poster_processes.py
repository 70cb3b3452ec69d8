"""http_poster in a real worker process: a 200 MB payload is posted byte-identical to a
loopback destination while the worker's peak memory (the kernel's VmHWM) stays below
150 MB, and a 202 answered there is settled by the destination's callback to the URL the
worker sent, through a real web process."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import requests
from sqlalchemy import select

from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
from b2bhub.models import Delivery, utcnow
from plugins.http_poster import HttpPoster
from tests.http_peer import Peer, Script
from tests.procs import wait_until
from tests.test_http_poster import SECRET

pytestmark = pytest.mark.processes
MB = 1 << 20
SIZE = 200 * MB
LIMIT_KB = 150 * 1024


class RandomStream:
    """``size`` random bytes read in chunks, hashed as they go (never held whole)."""

    def __init__(self, size: int):
        self.left, self.digest = size, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        chunk = os.urandom(n)
        self.left -= n
        self.digest.update(chunk)
        return chunk

    def readinto(self, buffer) -> int:
        chunk = self.read(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)


@pytest.fixture
def peer():
    server = Peer()
    yield server
    server.close()


def store(app, session, stream) -> int:
    stored = app.extensions["b2bhub.store"].put(stream)
    message = store_and_dispatch(session, NewMessage(
        source="inbox", from_party="acme", to_party="mycompany",
        stages={"unpacked": (stored.digest, stored.size)}, original_filename="big.bin"),
        utcnow())
    session.commit()
    return message.id


def wake(app) -> None:
    app.extensions["celery"].send_task("b2bhub.deliver", args=["poster"], queue="deliveries",
                                       routing_key="delivery.poster")


def state(session, message_id: int) -> str | None:
    session.expire_all()
    return session.scalar(select(Delivery.state).where(Delivery.message_id == message_id))


def peak_kb(pid: int) -> int:
    """The kernel's high-water mark of the process's resident memory, in KB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_200_mb_payload_is_posted_with_the_worker_below_150_mb(procs, app, session, hub,
                                                                  registry, peer):
    registry.register(HttpPoster)
    hub.parties()
    hub.instance("inbox", "manual_source")
    # signed: the signature is computed over the stage read in chunks, never held whole
    hub.instance("poster", "http_poster", config={"url": peer.url("/in"), "timeout": 60,
                                                  "signing_secret": SECRET})
    hub.route("inbox", "*", "*", "poster")
    worker = procs.worker()
    at_start = peak_kb(worker.pid)
    stream = RandomStream(SIZE)
    message_id = store(app, session, stream)
    wake(app)
    wait_until(lambda: state(session, message_id) == "delivered", 300, "the 200 MB delivered")

    seen = peer.seen[0]
    assert seen.size == SIZE and seen.sha256 == stream.digest.hexdigest()
    assert seen.headers["Content-Length"] == str(SIZE)
    assert seen.headers["webhook-signature"].startswith("v1,")
    peak = peak_kb(worker.pid)
    print(f"worker VmHWM {peak / 1024:.1f} MB for a {SIZE // MB} MB post "
          f"({at_start / 1024:.1f} MB once ready)")
    assert peak < LIMIT_KB, f"worker peak {peak / 1024:.1f} MB"


def test_a_callback_through_the_web_process_delivers(procs, app, session, hub, registry, peer):
    registry.register(HttpPoster)
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("poster", "http_poster", config={
        "url": peer.url("/in"), "accepted_means": "awaiting_receipt"})
    hub.route("inbox", "*", "*", "poster")
    peer.script("/in", Script(202, body=b"queued"))
    web = procs.web()
    procs.worker(extra_env={"B2BHUB_PUBLIC_URL": web.url})
    message_id = store(app, session, b"<order/>")
    wake(app)
    wait_until(lambda: state(session, message_id) == "awaiting_receipt", 60, "accepted")
    url = peer.seen[0].headers["X-B2BHub-Callback-Url"]
    assert url.startswith(f"{web.url}/callbacks/")
    # the web process checks the token with the secret key the worker made it with (the
    # one kept in the data directory they share)
    answer = requests.post(url, json={"result": "completed", "text": "done"}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert state(session, message_id) == "delivered"
    assert requests.post(url, json={"result": "completed"}, timeout=10).status_code == 409
