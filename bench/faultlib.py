"""What the fault suite (``bench/faults.py``) is made of: private servers it may kill,
a hub of real processes on them, a loopback AS2 partner, and the ledger of documents.

Servers: the PostgreSQL + Redis backend runs on a PostgreSQL cluster and a
``redis-server`` of the suite's own (``initdb`` into a temporary directory, own ports),
so stopping and restarting them disturbs nobody else on the machine. The embedded
backend (SQLite, kombu's SQLAlchemy broker) needs no server.

The ledger identifies side effects by the SHA-256 of each document's unique body, never
by the hub's records: a file the ``file_writer`` wrote, an attempt the counting sink
(``recorder`` of ``tests/plugin_dist``) saw, an AS2 message the partner received. The
hub's records only tell a document that is still on its way (stuck) from one that is
gone (lost).
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import benchlib  # noqa: F401  (puts the repository and tests/plugin_dist on sys.path)
import requests
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from tests.as2kit import make_pair
from tests.procs import Processes

ROOT = benchlib.ROOT
FINAL = ("delivered", "failed", "business_error", "cancelled")
TERMINAL_MESSAGE = ("delivered", "error", "cancelled")


# --- private servers --------------------------------------------------------------------

def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: its commands run as the ``postgres`` user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PrivatePostgres:
    """A PostgreSQL cluster of the suite's own: initdb into ``root``, port ``port``."""

    def __init__(self, root: Path, port: int):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb: PostgreSQL is needed")
        self.bin = Path(bins[-1]).parent
        self.root, self.port = root, port
        self.data, self.log = root / "pgdata", root / "postgres.log"
        self.admin_url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run(_as_postgres([str(self.bin / args[0]), *args[1:]]),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            # pg_ctl says only "Examine the log output": the server's log says why.
            server_log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"
                               f"{server_log}")

    def start(self) -> None:
        if not self.data.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres", "postgres")
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "--no-sync")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                        f"-c max_connections=200", "start")

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m fast``: every connection cut, the server back in seconds."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-m", mode, "restart")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop")

    def version(self) -> str:
        engine = create_engine(self.admin_url)
        try:
            with engine.connect() as conn:
                return conn.execute(text("SHOW server_version")).scalar()
        finally:
            engine.dispose()

    def fresh_database(self, name: str) -> str:
        engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"


class PrivateRedis:
    """A ``redis-server`` of the suite's own on ``port``, nothing saved to disk."""

    def __init__(self, root: Path, port: int):
        self.root, self.port = root, port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115  (the server keeps it)
        self.popen = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.root)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if subprocess.run(["redis-cli", "-p", str(self.port), "ping"],
                              capture_output=True).stdout.strip() == b"PONG":
                return
            time.sleep(0.1)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)
        self.popen = None

    def flush(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "flushall"], capture_output=True,
                       check=True)


# --- the documents -----------------------------------------------------------------------

def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


@dataclass
class Document:
    """One document put in: its unique body, the channel, when it was accepted (None
    while it was not, e.g. an AS2 post that never got its MDN)."""

    key: str
    channel: str
    name: str
    body: bytes
    accepted_at: float | None = None
    refusals: list[str] = field(default_factory=list)

    @property
    def digest(self) -> str:
        return sha256(self.body)


class Ledger:
    """Every document put in, and the check of what came out."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.docs: dict[str, Document] = {}
        self._lock = threading.Lock()

    def new(self, channel: str) -> Document:
        with self._lock:
            n = len(self.docs)
            key = f"{channel}-{n:05d}-{self.rng.getrandbits(48):012x}"
            body = (f"UNB+UNOC:3+ACME+HUB+{key}'".encode()
                    + self.rng.randbytes(self.rng.randint(200, 4000)).hex().encode())
            doc = Document(key, channel, f"{key}.edi", body)
            self.docs[key] = doc
            return doc

    def accepted(self) -> list[Document]:
        return [d for d in self.docs.values() if d.accepted_at is not None]


# --- the hub on a backend ------------------------------------------------------------------

@dataclass
class Backend:
    name: str
    database_url: str
    broker_url: str
    data_dir: str

    def as_dict(self) -> dict[str, str]:
        return {"database_url": self.database_url, "broker_url": self.broker_url,
                "data_dir": self.data_dir}


class Hub:
    """A migrated database with the suite's fixtures, real processes (``tests/procs.py``)
    and, on request, the AS2 partner. Instances: ``poller`` (file_poller on ``inbox``),
    ``as2in`` (as2_receiver), routed each to ``writer`` (file_writer, Max Concurrent
    Deliveries 4, ``{to}/{message_id}.edi``), ``sink`` (recorder) and ``poster``
    (http_poster, Max Concurrent Deliveries 4, posting to :class:`HttpSink`)."""

    def __init__(self, backend: Backend, tmp: Path, lease_seconds: int,
                 payload_dir: Path | None = None):
        self.backend, self.tmp = backend, tmp
        self.inbox, self.out, self.records = tmp / "in", tmp / "out", tmp / "sink"
        for d in (self.inbox / "acme", self.out, self.records):
            d.mkdir(parents=True, exist_ok=True)
        self.payload_dir = payload_dir or Path(backend.data_dir) / "payloads"
        self.procs = Processes(backend.as_dict(), tmp, str(self.payload_dir))
        self.engine = benchlib.Backend(backend.name, backend.database_url,
                                       backend.broker_url, backend.data_dir).engine()
        self.partner: As2Partner | None = None
        self.http_sink = HttpSink()
        self.web = None
        self.lease_seconds = lease_seconds
        self._migrate()
        self._configure()

    def _migrate(self) -> None:
        benchlib.migrate(benchlib.Backend(self.backend.name, self.backend.database_url,
                                          self.backend.broker_url, self.backend.data_dir))

    def _configure(self) -> None:
        self.certs = {"hub": make_pair("hub.example"), "acme": make_pair("acme.example")}
        retry = {"strategy": "schedule", "schedule": [1, 2, 5, 10, 10, 10, 10, 10, 10, 10]}
        data = {
            "organizations": [{"name": "mycompany"}], "partners": [{"name": "acme"}],
            "profiles": [
                {"party": "mycompany", "protocol": "as2", "as2_id": "HUB",
                 "certificate": {"pem": self.certs["hub"][0] + self.certs["hub"][1]}},
                {"party": "acme", "protocol": "as2", "as2_id": "ACME",
                 "url": "http://127.0.0.1:9/as2",
                 "certificate": {"pem": self.certs["acme"][0]}}],
            "plugins": [
                {"name": "poller", "type": "file_poller", "config": {
                    "base_directory": str(self.inbox), "path_pattern": "{to}/{filename}",
                    "polling_interval": 1}},
                {"name": "as2in", "type": "as2_receiver", "config": {}},
                {"name": "writer", "type": "file_writer", "max_concurrent_deliveries": 4,
                 "retry_policy": retry, "config": {
                     "base_directory": str(self.out),
                     "filename_pattern": "{to}/{message_id}.edi"}},
                {"name": "sink", "type": "recorder", "retry_policy": retry,
                 "config": {"record_dir": str(self.records)}},
                {"name": "poster", "type": "http_poster", "max_concurrent_deliveries": 4,
                 "retry_policy": retry, "config": {"url": self.http_sink.url,
                                                   "timeout": 10}}],
            "routes": [{"source": s, "target": t} for s in ("poller", "as2in")
                       for t in ("writer", "sink", "poster")]}
        path = self.tmp / "fixtures.json"
        path.write_text(json.dumps(data))
        done = self.procs.cli("fixtures", "load", str(path), timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"fixtures load failed: {done.stdout}{done.stderr}")
        from b2bhub.engine.settings import load_settings, save_settings
        with Session(self.engine) as session:
            settings = load_settings(session)
            if settings.lease_seconds != self.lease_seconds:
                from dataclasses import replace
                save_settings(session, replace(settings, lease_seconds=self.lease_seconds))
                session.commit()

    # processes
    def worker(self, extra_env: dict[str, str] | None = None, queues: str = "deliveries,default",
               wait: bool = True):
        return self.procs.worker(extra_env=extra_env, queues=queues, wait=wait)

    def start_web(self):
        self.web = self.procs.web(threads=8)
        return self.web

    def start_partner(self) -> As2Partner:
        self.partner = As2Partner(self.tmp, self.certs)
        return self.partner

    def as2_url(self) -> str:
        return f"{self.web.url}/as2/as2in" if self.web is not None else ""

    def stop(self) -> None:
        self.procs.stop_all()
        if self.partner is not None:
            self.partner.stop()
        self.http_sink.stop()
        self.engine.dispose()

    # putting documents in
    def drop(self, doc: Document) -> None:
        """Into ``inbox/acme/`` as a partner would: written beside, renamed into place;
        accepted once it is there (the directory is the hub's intake)."""
        staging = self.inbox.parent / "staging"
        staging.mkdir(exist_ok=True)
        (staging / doc.name).write_bytes(doc.body)
        os.rename(staging / doc.name, self.inbox / "acme" / doc.name)
        doc.accepted_at = time.monotonic()

    def send_as2(self, doc: Document, deadline: float) -> None:
        """Post it as the partner would until it gets a positive MDN or ``deadline``
        passes: every try with the same AS2 Message-ID, so a hub that stored an earlier
        try answers with that receipt and stores nothing new."""
        message_id = f"{doc.key}@acme.example"
        while time.monotonic() < deadline:
            url = self.as2_url()
            try:
                result = self.partner.send(url, doc.body, message_id=message_id,
                                           filename=doc.name)
            except requests.RequestException as exc:
                doc.refusals.append(f"partner: {type(exc).__name__}")
                time.sleep(1)
                continue
            if result.get("mdn_status") == "processed":
                doc.accepted_at = time.monotonic()
                return
            doc.refusals.append(f"{result.get('http_status')} {result.get('text', '')[:120]}"
                                f"{result.get('mdn_detail') or ''}".strip())
            time.sleep(1)

    # what came out
    def outcome(self, ledger: Ledger) -> dict:
        """Per accepted document: files written, sink attempts, messages of the hub."""
        files: Counter[str] = Counter()
        for path in self.out.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                files[sha256(path.read_bytes())] += 1
        attempts: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for path in self.records.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:  # a line cut by kill -9
                    continue
                attempts[rec["sha256"]].append((rec["message"], rec["delivery"]))
        return {"files": files, "attempts": attempts, "posts": self.http_sink.posts}

    def hub_view(self) -> dict[str, list[tuple[str, list[str]]]]:
        """By body digest: (message status, its delivery states) of each message."""
        from b2bhub.models import Delivery, Message
        view: dict[str, list] = defaultdict(list)
        with Session(self.engine) as session:
            states: dict[int, list[str]] = defaultdict(list)
            for message_id, state in session.execute(select(Delivery.message_id,
                                                            Delivery.state)):
                states[message_id].append(state)
            for message_id, digest, status in session.execute(
                    select(Message.id, Message.sha256, Message.status)):
                view[digest].append((status, states[message_id]))
        return view

    def left_in_inbox(self) -> set[str]:
        return {p.name for p in (self.inbox / "acme").iterdir() if p.is_file()}


class HttpSink:
    """A loopback HTTP receiver that counts every POST by the SHA-256 of its body and
    its ``Idempotency-Key``: the far side of the ``poster`` target (an ``http_poster``);
    :meth:`Hub.outcome` counts its posts (a second post of one document with the same
    key is a repeat, with another key a duplicate)."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        posts = self.posts = defaultdict(list)
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    posts[sha256(body)].append(self.headers.get("Idempotency-Key"))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/inbound"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class As2Partner:
    """``tests/as2_partner.py`` in a process of its own."""

    def __init__(self, tmp: Path, certs: dict):
        cfg = tmp / "partner.json"
        cfg.write_text(json.dumps({"as2_id": "ACME", "cert": certs["acme"][0],
                                   "key": certs["acme"][1], "hub_as2_id": "HUB",
                                   "hub_cert": certs["hub"][0]}))
        self.log = open(tmp / "partner.log", "ab")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.as2_partner", str(cfg)],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, start_new_session=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"
        self.http = requests.Session()

    def send(self, hub_url: str, data: bytes, **order) -> dict:
        order = {"data": base64.b64encode(data).decode(), "hub_url": hub_url,
                 "sign": True, "encrypt": True, "mdn_mode": "sync", **order}
        answer = self.http.post(self.url + "/send", json=order, timeout=90)
        answer.raise_for_status()
        return answer.json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def temp_root(prefix: str) -> Path:
    """A work directory others may enter (PostgreSQL runs as its own user in it)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path
