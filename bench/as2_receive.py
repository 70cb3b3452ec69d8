"""AS2 receive with a signed synchronous MDN against gunicorn, beside the bare pyas2lib
cost of parsing the same messages and building the same MDNs, in the same run; and the
peak RSS of receiving and of sending a large message.

    python bench/as2_receive.py --backend embedded --sizes 10240 1048576 --count 40
    python bench/as2_receive.py --backend postgres --sizes 10240 --count 200
    python bench/as2_receive.py --rss-mb 100

Messages are signed (sha256) and encrypted (AES-256) by a pyas2lib client built before
the clock starts; each asks for a signed sync MDN. "hub" is the time from the request to
the whole MDN received (gunicorn with ``--web-workers`` worker processes, default as
``b2bhub run`` starts them (B2BHUB_WEB_CONCURRENCY: the cores, 2 to 8), 8 threads each,
``B2BHUB_WEB_THREADS``); "bare" is
``pyas2lib.Message.parse`` + MDN build of the same message in this process. Bare and hub
alternate message by message (which goes first alternates too), so both see the same
load from whatever else runs on the machine. CPU per message: bare in this process; hub
the gunicorn workers' user + system time over the sequential run; client this process's
CPU per post (building the request and reading the MDN, which the hub figure includes
and the bare one does not). 4 concurrent clients post the same number of messages from 4
threads; "4 clients / seq" is their messages/s over the sequential messages/s of the
same run (both measured as messages over the wall time of posting them). Every message
is checked afterwards: stored once with the bytes sent and dispatched to exactly one
delivery.

django-pyas2 (1.2.3, from PyPI) is the third peer, unless ``--no-django-pyas2``: in a
virtualenv of its own (bench/djpyas2.py makes it once, ``--django-pyas2-venv``), a
minimal Django project under gunicorn with as many sync workers as the hub has worker
processes, its database following ``--backend`` (SQLite, or a PostgreSQL database of
its own), the same organization, partner and certificates. It takes its turn in the
sequential alternation with the same messages, and the 4-client posts go to the hub and
to it in alternating rounds of the same messages. Its MDNs are verified as the hub's,
and every message it kept is checked (status success, the document sent); one failed
post ends the bench with an error instead of its figures.

``--py-spy FILE``: py-spy (installed beside this Python or on PATH) records the first web
worker during the sequential posts, where it holds the GIL, as collapsed stacks.

``--rss-mb``: the message is over the instances' ``stream_threshold`` (8 MiB) from
about 8 MB, so it takes the streaming path (plugins.as2.stream) each way;
``bench/as2_large.py`` measures 1 GiB signed, encrypted and compressed.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from benchlib import (  # noqa: E402
    environment,
    free_port,
    fresh_backend,
    make_app,
    print_table,
    process_cpu,
    start_py_spy,
    stop_py_spy,
    wait_booted,
    wait_serving,
    worker_pids,
)
from djpyas2 import DEFAULT_VENV, DjangoPyas2, ensure_venv, versions  # noqa: E402
from pyas2lib import Message, Organization, Partner  # noqa: E402

from plugins.as2 import lib  # noqa: E402
from tests.as2kit import make_pair  # noqa: E402


def configure(backend, certs, sink_url: str | None = None) -> None:
    from b2bhub.config.extensions import db
    from b2bhub.services import config as svc
    from plugins.as2 import profiles
    from plugins.as2.plugin import As2Receiver, As2Sender
    app = make_app(backend)
    with app.app_context():
        registry = app.extensions["b2bhub.plugin.registry"]
        registry.register(As2Receiver)
        registry.register(As2Sender)
        svc.create_party(db.session, "organization", "mycompany")
        svc.create_party(db.session, "partner", "acme")
        profiles.save_profile(db.session, "organization", "mycompany", {
            "as2_id": "HUB", "certificate": {"pem": certs["hub"][0],
                                             "private_key_pem": certs["hub"][1]}})
        profiles.save_profile(db.session, "partner", "acme", {
            "as2_id": "ACME", "url": sink_url or "http://127.0.0.1:9/as2", "sign": True,
            "encrypt": True, "mdn_mode": "none", "chunked": True,
            "certificate": {"pem": certs["acme"][0]}})
        svc.save_instance(db.session, registry, {
            "name": "as2in", "type": "as2_receiver", "config": {"max_size": 300 << 20}})
        svc.save_instance(db.session, registry, {"name": "sink", "type": "noop"})
        svc.save_instance(db.session, registry, {"name": "as2out", "type": "as2_sender"})
        svc.create_route(db.session, registry, "as2in", "*", "*", "sink", actor="bench")
        db.session.commit()
        app.extensions["sqlalchemy"].engines[None].dispose()


def build(certs, size: int, n: int) -> list[tuple[dict, bytes]]:
    key = (certs["acme"][1] + certs["acme"][0]).encode()
    org = Organization(as2_name="ACME", sign_key=key, decrypt_key=key)
    hub = Partner(as2_name="HUB", verify_cert=certs["hub"][0].encode(),
                  encrypt_cert=certs["hub"][0].encode(), validate_certs=False, sign=True,
                  encrypt=True, enc_alg="aes_256_cbc", mdn_mode="SYNC",
                  mdn_digest_alg="sha256")
    data = (b"ISA*00*" + os.urandom(size // 2).hex().encode())[:size]
    out = []
    for _ in range(n):
        message = Message(org, hub)
        message.build(data, filename="bench.edi", content_type="application/edi-x12")
        out.append(Sent(dict(message.headers), message.content, message, data))
    return out


class Sent(tuple):
    """A built message: (headers, body), with the client's pyas2lib Message (its
    Message-ID and MIC, to verify the MDN against) and the document it carries."""

    def __new__(cls, headers: dict, body: bytes, message, data: bytes):
        sent = super().__new__(cls, (headers, body))
        sent.message, sent.data = message, data
        return sent


class Checks:
    """What the bench verifies after the clock stopped, so that a fast answer that is
    wrong never counts: every MDN is parsed by pyas2lib as the partner would parse it
    (signature verified with the hub's certificate, MIC compared with the one the
    client computed, disposition ``processed``), and every message the hub took is
    stored with exactly the bytes sent and dispatched (its delivery row exists)."""

    def __init__(self):
        self.mdns: list[tuple[Sent, dict, bytes]] = []
        self._lock = threading.Lock()

    def keep(self, sent: Sent, headers: dict, content: bytes) -> None:
        with self._lock:
            self.mdns.append((sent, headers, content))

    def verify(self, backend) -> int:
        verified = self.verify_mdns()
        self._check_stored(backend)
        return verified

    def verify_mdns(self) -> int:
        """Every MDN kept, as the partner parses it; the bench ends on the first that
        does not verify."""
        from pyas2lib import Mdn
        for sent, headers, content in self.mdns:
            raw = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode() \
                + b"\r\n" + content
            status, detail = Mdn().parse(raw, lambda _id, _to, m=sent.message: m)
            if status != "processed":
                raise SystemExit(f"MDN of {sent.message.message_id} did not verify: "
                                 f"{status} {detail}")
        return len(self.mdns)

    def _check_stored(self, backend) -> None:
        import hashlib

        from sqlalchemy import text as sql
        expected = {f"<{s.message.message_id}>": hashlib.sha256(s.data).hexdigest()
                    for s, _h, _c in self.mdns}
        engine = backend.engine()
        with engine.connect() as conn:
            rows = conn.execute(sql(
                "SELECT m.external_id, p.digest, p.size, "
                "(SELECT count(*) FROM deliveries d WHERE d.message_id = m.id) "
                "FROM messages m JOIN payloads p ON p.message_id = m.id "
                "AND p.stage = 'unpacked' WHERE m.source = 'as2in'")).all()
        engine.dispose()
        found = {}
        for external_id, digest, _size, deliveries in rows:
            key = external_id if external_id.startswith("<") else f"<{external_id}>"
            found[key] = (digest, deliveries)
        missing = [k for k in expected if k not in found]
        if missing:
            raise SystemExit(f"{len(missing)} accepted messages not stored, e.g. {missing[0]}")
        store = Path(backend.data_dir) / "payloads"
        for key, digest in expected.items():
            stored_digest, deliveries = found[key]
            if stored_digest != digest or deliveries != 1:
                raise SystemExit(f"{key}: stored {stored_digest} with {deliveries} "
                                 f"deliveries, expected {digest} with 1")
        self._read_back(backend, {found[k][0] for k in expected}, store)

    @staticmethod
    def _read_back(backend, digests: set[str], store: Path) -> None:
        """Read every stored document through the payload store (sha256 checked)."""
        app = make_app(backend)
        with app.app_context():
            payloads = app.extensions["b2bhub.store"]
            for digest in digests:
                with payloads.open(digest) as f:
                    while f.read(1 << 20):
                        pass
            app.extensions["sqlalchemy"].engines[None].dispose()


class Bare:
    """pyas2lib alone: parse (decrypt, verify, MIC) and the signed MDN, per message (our
    key loaded once beforehand, as the hub keeps it loaded). ``hub_way``: the same
    pyas2lib calls as the hub makes them, with the partner's certificate loaded once and
    kept as the hub's (plugins.as2.lib: no debug copies of the MIME
    tree, the MDN signed through OpenSSL and its body put together, not rendered
    again, each header parsed once while MIME is rendered), to show what the hub spends
    beyond its own protocol work."""

    def __init__(self, certs, hub_way: bool = False):
        key = (certs["hub"][1] + certs["hub"][0]).encode()
        self.cert = certs["acme"][0].encode()
        self.hub_way = hub_way
        if hub_way:  # the keys loaded once and kept, as the hub keeps them
            self.org = lib.HubOrganization(as2_name="HUB", sign_key=key, decrypt_key=None)
            self.org.decrypt_key = [Organization.load_key(key, None)]
            self.partner = lib.LoadedPartner(as2_name="ACME", verify_cert=self.cert,
                                             validate_certs=False, sign=True, encrypt=True)
        else:
            self.org = Organization(as2_name="HUB", sign_key=key, decrypt_key=key)

    def __call__(self, message) -> tuple[float, float]:
        """(seconds, CPU seconds) of one message."""
        headers, body = message
        raw = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode() + b"\r\n" + body
        start, cpu = time.perf_counter(), time.thread_time()
        partner = self.partner if self.hub_way else Partner(
            as2_name="ACME", verify_cert=self.cert, validate_certs=False, sign=True,
            encrypt=True)
        if self.hub_way:
            with lib.parsing():
                status, _exc, mdn = Message().parse(raw, find_org_cb=lambda _i: self.org,
                                                    find_partner_cb=lambda _i: partner)
            _ = lib.mdn_content(mdn)
        else:
            status, _exc, mdn = Message().parse(raw, find_org_cb=lambda _i: self.org,
                                                find_partner_cb=lambda _i: partner)
            _ = mdn.content
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        assert status == "processed"
        return elapsed, cpu


def post(url: str, message, checks: Checks | None = None) -> float:
    return timed_post(url, message, checks)[0]


def timed_post(url: str, message, checks: Checks | None = None) -> tuple[float, float]:
    """(seconds, this thread's CPU seconds) of one post on a new connection, to the whole
    MDN received. http.client rather than requests: the client's own work is in the hub
    figure and not in the bare one, so it is kept small (requests costs about 1 ms of CPU
    a post more)."""
    headers, body = message
    parts = urlsplit(url)
    start, cpu = time.perf_counter(), time.thread_time()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    try:
        connection.request("POST", parts.path, body=body, headers=headers)
        answer = connection.getresponse()
        content = answer.read()
    finally:
        connection.close()
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    assert answer.status == 200 and b"processed" in content, content[:300]
    assert answer.getheader("Content-Type").startswith("multipart/signed")
    if checks is not None:  # kept now, verified after the clock stopped
        checks.keep(message, dict(answer.getheaders()), content)
    return elapsed, cpu


def start_gunicorn(backend, port: int, workers: int = 1) -> subprocess.Popen:
    proc = _gunicorn("wsgi:app", port, workers, HERE.parent,
                     {**backend.env(), "B2BHUB_LOG_LEVEL": "warning"}, "info")
    return wait_serving(proc, f"http://127.0.0.1:{port}/api/v1/health", "gunicorn")


def start_floor(backend, certs, port: int, workers: int) -> subprocess.Popen:
    """``bench/as2_receive_floor.py`` under the hub's gunicorn settings (its module
    docstring says what it does and leaves out)."""
    config = Path(backend.data_dir) / "as2-floor.json"
    config.write_text(json.dumps({"key": certs["hub"][1] + certs["hub"][0],
                                  "partner_cert": certs["acme"][0]}))
    env = {**backend.env(), "AS2_FLOOR_CONFIG": str(config),
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    proc = _gunicorn("as2_receive_floor:app", port, workers, HERE, env, "warning")
    # any answer will do: a GET is no AS2 message, and the floor says so
    return wait_serving(proc, f"http://127.0.0.1:{port}/as2", "the floor's gunicorn")


def _gunicorn(app: str, port: int, workers: int, cwd: Path, env: dict,
              log_level: str) -> subprocess.Popen:
    """gunicorn as the bench runs both servers: gthread workers of 8 threads each."""
    return subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "--workers",
                             str(workers), "--worker-class", "gthread", "--threads", "8",
                             "--bind", f"127.0.0.1:{port}", "--log-level", log_level, app],
                            cwd=cwd, env=env)


def worker_pid(master: int) -> int:
    return worker_pids(master)[0]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Peer:
    """A server the bench posts to: its URL, its gunicorn master, and what its posts
    took. ``lenient``: a failed post is counted (the run then ends with an error and no
    figure for it) instead of ending the bench at once."""

    def __init__(self, name: str, url: str, master: int, workers: int,
                 lenient: bool = False):
        self.name, self.url, self.lenient = name, url, lenient
        self.workers = worker_pids(master, workers)
        self.checks = Checks()
        self.failures: list[str] = []
        self.seq: list[tuple[float, float]] = []
        self.seq_busy = 0.0
        self.many: list[float] = []
        self.many_wall = 0.0
        self.cpu = 0.0

    def post(self, message, checks: Checks | None = None) -> tuple[float, float]:
        if not self.lenient:
            return timed_post(self.url, message, checks)
        try:
            return timed_post(self.url, message, checks)
        except (AssertionError, OSError, http.client.HTTPException) as exc:
            self.failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            return float("nan"), 0.0

    def sequential(self, message) -> None:
        posted = time.perf_counter()
        self.seq.append(self.post(message, self.checks))
        self.seq_busy += time.perf_counter() - posted

    def concurrent(self, messages) -> None:
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            self.many += list(pool.map(lambda m: self.post(m, self.checks)[0], messages))
        self.many_wall += time.perf_counter() - start

    def reset(self) -> None:
        self.seq, self.seq_busy, self.many, self.many_wall = [], 0.0, [], 0.0


def verify_django_pyas2(peer: Peer, server: DjangoPyas2, posts: int) -> int:
    """django-pyas2's answers and what it kept: every post answered with a signed MDN
    that pyas2lib verifies (signature, MIC, ``processed``), and every message stored by
    django-pyas2 with status success and exactly the document sent. Ends the bench
    loudly on any failure: a column of failures is not a figure."""
    if peer.failures:
        raise SystemExit(f"django-pyas2: {len(peer.failures)} of {posts} posts failed, "
                         f"no figure for it; the first: {peer.failures[0]}")
    verified = peer.checks.verify_mdns()
    stored = server.stored()
    for sent, _headers, _content in peer.checks.mdns:
        status, digest = stored.get(sent.message.message_id, (None, None))
        if status != "S" or digest != hashlib.sha256(sent.data).hexdigest():
            raise SystemExit(f"django-pyas2 kept {sent.message.message_id} as {status} "
                             f"{digest}, expected S {hashlib.sha256(sent.data).hexdigest()}")
    return verified


def verify_floor(peer: Peer, backend) -> int:
    """The floor's answers and what it kept: every MDN verified as the hub's, and for
    every message acknowledged its row, with the digest of the document sent, and its
    three stages on disk under their digests. Ends the bench on the first failure."""
    verified = peer.checks.verify_mdns()
    engine = backend.engine()
    with engine.connect() as conn:
        rows = {r[0]: r[1:] for r in conn.exec_driver_sql(
            "SELECT message_id, raw, unpacked, receipt FROM as2_floor")}
    engine.dispose()
    directory = Path(backend.data_dir) / "as2-floor"
    for sent, _headers, _content in peer.checks.mdns:
        digests = rows.get(sent.message.message_id)
        if digests is None or digests[1] != hashlib.sha256(sent.data).hexdigest():
            raise SystemExit(f"the floor kept {sent.message.message_id} as {digests}")
        missing = [d for d in digests if not (directory / d).is_file()]
        if missing:
            raise SystemExit(f"the floor's stage {missing[0]} is not on disk")
    return verified


def run_latency(args, certs) -> None:
    rows, versus = [], []
    django = None
    if args.django_pyas2:
        python = ensure_venv(Path(args.django_pyas2_venv))
        print(f"django-pyas2 virtualenv: {versions(python)} (the hub: pyas2lib "
              f"{importlib.metadata.version('pyas2lib')})")
        django = DjangoPyas2(python, args.backend, certs, args.web_workers)
    try:
        with fresh_backend(args.backend) as backend:
            configure(backend, certs)
            port = free_port()
            server = start_gunicorn(backend, port, args.web_workers)
            peers, floor_server = [], None
            try:
                hub = Peer("hub", f"http://127.0.0.1:{port}/as2/as2in", server.pid,
                           args.web_workers)
                peers.append(hub)
                if args.floor:
                    floor_port = free_port()
                    floor_server = start_floor(backend, certs, floor_port, args.web_workers)
                    peers.append(Peer("floor", f"http://127.0.0.1:{floor_port}/as2",
                                      floor_server.pid, args.web_workers))
                if django is not None:
                    master = django.start(free_port())
                    peers.append(Peer("django-pyas2", django.url, master.pid,
                                      args.web_workers, lenient=True))
                wait_booted([pid for peer in peers for pid in peer.workers])
                _run_sizes(args, certs, peers, rows, versus)
            finally:
                for running in (server, floor_server):
                    if running is not None:
                        running.terminate()
                        running.wait(30)
                if django is not None:
                    django.stop()
            verified = hub.checks.verify(backend)
            if floor_server is not None:
                floor_verified = verify_floor(peers[1], backend)
        if django is not None:
            other = peers[-1]
            posts = len(other.checks.mdns) + len(other.failures)
            django_verified = verify_django_pyas2(other, django, posts)
    finally:
        if django is not None:
            django.remove()
    print(f"verified after the run: {verified} MDNs (signature, MIC, disposition) and the "
          "stored bytes and delivery of every message they acknowledged")
    if args.floor:
        print(f"the floor verified after the run: {floor_verified} MDNs (signature, MIC, "
              "disposition) and the three stages and the row of every message")
    print_table(f"AS2 receive, signed + encrypted, signed sync MDN (median latency), "
                f"{args.web_workers} web worker processes",
                ["size", "messages", "bare ms", "hub ms", "hub/bare", "hub-way ms",
                 "hub - hub-way ms", "floor ms", "floor - hub-way ms", "hub - floor ms",
                 "hub/floor", "bare CPU ms", "hub CPU ms", "floor CPU ms", "client CPU ms",
                 "1000/median", "seq msg/s", "4 clients ms", "4 clients msg/s",
                 "4 clients / seq"], rows)
    if django is not None:
        print(f"django-pyas2 verified after the run: {django_verified} MDNs (signature, MIC, "
              "disposition) and the stored document of every message")
    if versus:
        print_table(f"The same messages to the other servers (gunicorn, {args.web_workers} "
                    "worker processes each; django-pyas2's sync workers), in the same run, "
                    "alternating with the hub and bare",
                    ["peer", "size", "messages", "hub ms", "peer ms",
                     "hub seq msg/s", "peer seq msg/s", "hub/peer seq",
                     "hub 4 clients msg/s", "peer 4 clients msg/s", "hub/peer 4 clients",
                     "hub CPU ms", "peer CPU ms"], versus)


def _run_sizes(args, certs, peers: list[Peer], rows: list, versus: list) -> None:
    """Per size: warm-up, then the sequential posts, each message to every peer and to
    bare pyas2lib in turn (who goes first rotates message by message), then the
    4-client posts in rounds, the peers alternating round by round."""
    hub = peers[0]
    bare_one, hub_way = Bare(certs), Bare(certs, hub_way=True)
    workers = hub.workers
    for size in args.sizes:
        count = args.count if size < 500_000 else max(4, args.count // 4)
        for message in build(certs, size, 2 * args.web_workers):  # warm up
            for peer in peers:
                peer.post(message)
            bare_one(message)
            hub_way(message)
        seq = build(certs, size, count)
        conc = build(certs, size, count)
        for peer in peers:
            peer.reset()
        bare, own = [], []

        def bare_turn(message, bare=bare, own=own):
            bare.append(bare_one(message))
            own.append(hub_way(message))

        turns = [*(peer.sequential for peer in peers), bare_turn]
        spy = start_py_spy(args.py_spy, workers[:1])
        for peer in peers:
            peer.cpu = sum(map(process_cpu, peer.workers))
        for i, message in enumerate(seq):  # alternating, the same messages
            shift = i % len(turns)
            for turn in turns[shift:] + turns[:shift]:
                turn(message)
        time.sleep(0.2)  # the work after the last response is the servers' too
        for peer in peers:
            peer.cpu = sum(map(process_cpu, peer.workers)) - peer.cpu
        stop_py_spy(spy)
        rounds = max(1, min(4, count // 4))
        for r in range(rounds):  # the same messages to each peer, in alternating rounds
            part = conc[r * count // rounds:(r + 1) * count // rounds]
            order = peers if r % 2 == 0 else peers[::-1]
            for peer in order:
                peer.concurrent(part)
        b, h, c, o = (statistics.median(x) * 1000 for x in (
            [t for t, _cpu in bare], [t for t, _cpu in hub.seq], hub.many,
            [t for t, _cpu in own]))
        bare_cpu, client_cpu = (statistics.mean(c for _t, c in x) * 1000
                                for x in (bare, hub.seq))
        floor = next((peer for peer in peers if peer.name == "floor"), None)
        f = statistics.median(t for t, _cpu in floor.seq) * 1000 if floor else float("nan")
        rows.append([f"{size // 1024} KB", count, f"{b:.1f}", f"{h:.1f}",
                     f"{h / b:.2f}x", f"{o:.1f}", f"{h - o:.1f}", f"{f:.1f}", f"{f - o:.1f}",
                     f"{h - f:.1f}", f"{h / f:.2f}x", f"{bare_cpu:.1f}",
                     f"{hub.cpu / count * 1000:.1f}",
                     f"{floor.cpu / count * 1000:.1f}" if floor else "", f"{client_cpu:.1f}",
                     f"{1000 / h:.1f}", f"{count / hub.seq_busy:.1f}", f"{c:.1f}",
                     f"{count / hub.many_wall:.1f}", f"{hub.seq_busy / hub.many_wall:.2f}x"])
        for other in peers[1:]:
            d = statistics.median(t for t, _cpu in other.seq) * 1000
            hub_seq, other_seq = count / hub.seq_busy, count / other.seq_busy
            hub_many, other_many = count / hub.many_wall, count / other.many_wall
            versus.append([other.name, f"{size // 1024} KB", count, f"{h:.1f}", f"{d:.1f}",
                           f"{hub_seq:.1f}", f"{other_seq:.1f}",
                           f"{hub_seq / other_seq:.2f}x", f"{hub_many:.1f}",
                           f"{other_many:.1f}", f"{hub_many / other_many:.2f}x",
                           f"{hub.cpu / count * 1000:.1f}",
                           f"{other.cpu / count * 1000:.1f}"])


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                while size:
                    size -= len(self.rfile.read(min(size, 1 << 20)))
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left:
                left -= len(self.rfile.read(min(left, 1 << 20)))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def run_rss(args, certs) -> None:
    size = args.rss_mb << 20
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    with fresh_backend(args.backend) as backend:
        configure(backend, certs, f"http://127.0.0.1:{sink.server_port}/as2")
        port = free_port()
        server = start_gunicorn(backend, port)
        try:
            pid = worker_pid(server.pid)
            idle = peak_rss_mb(pid)
            [message] = build(certs, size, 1)
            post(f"http://127.0.0.1:{port}/as2/as2in", message)
            received = peak_rss_mb(pid)
        finally:
            server.terminate()
            server.wait(30)
        del message
        child = subprocess.run([sys.executable, __file__, "--send-child", str(args.rss_mb)],
                               env=backend.env(), capture_output=True, text=True)
        sent = child.stdout.strip() or child.stderr[-500:]
    print_table(f"Peak RSS with a {args.rss_mb} MB message",
                ["process", "idle MB", "peak MB"],
                [["web (gunicorn worker) receiving", f"{idle:.0f}", f"{received:.0f}"],
                 ["sending (as2_sender attempt)", "", sent]])


def send_child(mb: int) -> None:
    """In a fresh process: one as2_sender attempt of an mb-MB message; prints peak RSS."""
    from b2bhub import create_app
    from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
    from b2bhub.engine.runner import TargetRunner
    from b2bhub.models import Delivery, utcnow
    from b2bhub.runtime.hub import new_session
    app = create_app({"WAKEUP_PUBLISHER": lambda items: None})
    with app.app_context():
        store = app.extensions["b2bhub.store"]
        stored = store.put(iter_file(mb))
        with new_session() as session:
            store_and_dispatch(session, NewMessage(
                source="@operator", from_party="mycompany", to_party="acme",
                stages={"unpacked": (stored.digest, stored.size)}, targets=["as2out"]),
                utcnow())
            session.commit()
        TargetRunner(new_session, app.extensions["b2bhub.plugin.registry"], store, "bench").drain(
            "as2out", budget=600)
        with new_session() as session:
            state = session.query(Delivery.state).filter(Delivery.target == "as2out").scalar()
    print(f"{peak_rss_mb(os.getpid()):.0f} ({state})")


class iter_file:
    """A readable stream of mb MB of text made on the fly."""

    def __init__(self, mb: int):
        self.left = mb << 20

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return b"A" * n


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--send-child":
        send_child(int(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="embedded", choices=("embedded", "postgres"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[10240, 1048576])
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--web-workers", type=int, default=None,
                        help="gunicorn worker processes (default: as b2bhub run starts)")
    parser.add_argument("--py-spy", metavar="FILE", default=None,
                        help="profile the first web worker during the sequential posts "
                             "with py-spy (pip install py-spy) into FILE, collapsed stacks")
    parser.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                        help="also post every message to the floor, bench/as2_receive_floor.py "
                             "(default; --no-floor: without it)")
    parser.add_argument("--django-pyas2", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="also post every message to django-pyas2 1.2.3 under gunicorn "
                             "(default; --no-django-pyas2: the hub and bare only)")
    parser.add_argument("--django-pyas2-venv", metavar="PATH", default=str(DEFAULT_VENV),
                        help="the virtualenv django-pyas2 runs in, made there when missing "
                             "(default: %(default)s)")
    parser.add_argument("--rss-mb", type=int, default=0,
                        help="measure peak RSS with a message this large instead")
    args = parser.parse_args()
    if args.web_workers is None:
        from b2bhub.config.environment import web_concurrency
        args.web_workers = web_concurrency()
    certs = {"hub": make_pair("hub.bench"), "acme": make_pair("acme.bench")}
    for name, value in environment([args.backend]):
        print(f"{name}: {value}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                            capture_output=True, text=True).stdout.strip()
    print(f"code: {HERE.parent} at {commit or '?'}")
    if args.rss_mb:
        run_rss(args, certs)
    else:
        run_latency(args, certs)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
