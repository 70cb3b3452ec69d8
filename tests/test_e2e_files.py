"""Files end to end with real processes (issue 3, "Must show"): a ``file_poller`` picks
files up from its directory in a ``celery worker`` scheduled by ``celery beat``, and a
``file_writer`` writes them out; the instances come from ``b2bhub fixtures load`` in a
process of its own, operator actions go through the web process's REST API.

The test process only drops files, kills processes and reads the outcome: the files on
disk, the database rows and the history a user reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import signal
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import requests
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine.inspection import inspect_stream
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.models import Alert, Delivery, HistoryLine, Message, Payload, PollerPickup
from b2bhub.payloads.store import PayloadStore
from tests.procs import Processes, wait_until

pytestmark = pytest.mark.processes

# the business documents at the top of tests/samples (its cem/ folder holds AS2
# certificate-exchange messages, not documents a partner drops)
SAMPLES = sorted(p for p in (Path(__file__).parent / "samples").iterdir()
                 if p.is_file() and p.name != "README.md")


@pytest.fixture
def procs(backend, app, tmp_path):
    """Processes on the test backend, every one stopped at the end of the test; the
    broker's queues start empty."""
    app.extensions["celery"].control.purge()
    processes = Processes(backend, tmp_path, app.config["PAYLOAD_DIR"])
    yield processes
    processes.stop_all()


@pytest.fixture
def inbox(tmp_path) -> Path:
    return tmp_path / "in"


# --- helpers ---------------------------------------------------------------------------

def load_fixtures(procs: Processes, inbox: Path, writer: dict | None = None) -> None:
    """Parties, a poller on ``inbox`` (``{to}/{filename}``, every second) and, when
    ``writer`` is given, a file_writer with those fields routed from it; loaded by
    ``b2bhub fixtures load`` in a process of its own."""
    data: dict = {
        "organizations": [{"name": "mycompany"}], "partners": [{"name": "acme"}],
        "plugins": [{"name": "poller", "type": "file_poller", "config": {
            "base_directory": str(inbox), "path_pattern": "{to}/{filename}",
            "polling_interval": 1}}]}
    if writer is not None:
        data["plugins"].append({"name": "writer", "type": "file_writer", **writer})
        data["routes"] = [{"source": "poller", "target": "writer"}]
    path = procs.tmp / "fixtures.json"
    path.write_text(json.dumps(data))
    done = procs.cli("fixtures", "load", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def drop(inbox: Path, files: dict[str, bytes], to: str = "acme") -> None:
    """Put files into ``inbox/<to>/`` as a partner would: each written under a
    temporary name beside the inbox, then renamed into place."""
    staging, directory = inbox.parent / "staging", inbox / to
    staging.mkdir(exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (staging / name).write_bytes(body)
        os.rename(staging / name, directory / name)


def rows(stmt) -> list:
    """Run a query in a fresh session (never a stale snapshot)."""
    with Session(db.engine) as s:
        return s.execute(stmt).all()


def count(model) -> int:
    return rows(select(func.count()).select_from(model))[0][0]


def history(message_id: int) -> list[tuple[str, str, str]]:
    """(type, actor, text) of every history line of the message, oldest first."""
    return [tuple(r) for r in rows(select(HistoryLine.type, HistoryLine.actor,
                                          HistoryLine.text)
                                   .where(HistoryLine.message_id == message_id)
                                   .order_by(HistoryLine.id))]


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def left_in(directory: Path) -> list[str]:
    return sorted(os.listdir(directory)) if directory.exists() else []


# --- poller to writer ------------------------------------------------------------------

def documents() -> dict[str, bytes]:
    """20 sample documents under names of their own, and a few made here: binary, empty,
    larger than one read chunk, and names with a space, a non-ASCII letter and a ``:``."""
    files = {f"{i:02d}-{p.name}": p.read_bytes() for i, p in
             enumerate(SAMPLES * 5)}
    rng = random.Random(3)
    files["binary.bin"] = bytes(range(256)) * 8 + b"\r\n\x00\xff"
    files["empty.txt"] = b""
    files["large.xml"] = b"<rows>" + b"".join(
        b"<row n='%d'>%s</row>\n" % (i, rng.randbytes(20).hex().encode())
        for i in range(40000)) + b"</rows>"
    files["Rechnung für März.xml"] = SAMPLES[-1].read_bytes()
    files["colon:name.edi"] = SAMPLES[0].read_bytes()
    return files


def written_as(name: str) -> str:
    """The name the writer gives: a ``:`` in a value becomes ``_``."""
    return name.replace(":", "_")


def test_dropped_files_arrive_byte_identical_and_the_history_tells_the_story(
        procs, inbox, tmp_path):
    out = tmp_path / "out"
    load_fixtures(procs, inbox, writer={"config": {
        "base_directory": str(out), "filename_pattern": "{to}/{original_filename}"}})
    worker = procs.worker(wait=False)
    procs.beat()
    worker.wait_in_log(" ready.", timeout=60)
    files = documents()
    assert len(files) == 25 and len(SAMPLES) == 4

    drop(inbox, files)
    wait_until(lambda: count(Message) == len(files) and dict(rows(
        select(Delivery.state, func.count()).group_by(Delivery.state))) == {
        "delivered": len(files)}, 60, "all stored and delivered")

    for name, body in files.items():
        assert (out / "acme" / written_as(name)).read_bytes() == body, name
    assert left_in(out / "acme") == sorted(written_as(n) for n in files)  # no temp files
    assert left_in(inbox / "acme") == [] and left_in(inbox) == ["acme"]
    assert count(PollerPickup) == 0
    messages = rows(select(Message.id, Message.original_filename, Message.status,
                           Message.from_party, Message.to_party, Message.sha256))
    assert sorted(m.original_filename for m in messages) == sorted(files)
    first = {}  # the first copy of each interchange: the one the others repeat
    for m in sorted(messages, key=lambda m: m.id):
        first.setdefault(m.sha256, m.id)
    for m in messages:
        assert (m.status, m.from_party, m.to_party) == ("delivered", "mycompany", "acme")
        assert m.sha256 == sha256(files[m.original_filename])
        assert_story(history(m.id), m.original_filename, len(files[m.original_filename]),
                     envelope_lines(files[m.original_filename], first[m.sha256], m.id))


def envelope_lines(body: bytes, first: int, message_id: int) -> list[tuple[str, str]]:
    """What the checks at intake (docs/edi.md) say of an interchange with the default
    settings: its envelope errors, accepted; and, for a copy of one received before, a
    duplicate of the first copy. None for a file that is no interchange."""
    env = inspect_stream(io.BytesIO(body))
    if env is None:
        return []
    lines = [("edi_errors", f"envelope errors: {'; '.join(env.errors)} (accepted, as the "
              "source's edi_errors says)")] if env.errors else []
    if first != message_id:
        lines.append(("duplicate_received", f"interchange {env.control} from {env.sender} "
                      f"was received before as message {first}"))
    return lines


def assert_story(lines: list[tuple[str, str, str]], name: str, size: int,
                 envelope: list[tuple[str, str]] = ()) -> None:
    """Received by the poller naming the file, queued, what the envelope's checks said
    (if anything), attempt started, written, with the status changes between, and
    nothing else."""
    assert [(kind, text) for kind, _, text in lines] == [
        ("received", f"{name} received from mycompany for acme by poller"),
        ("delivery_changed", "writer: queued"),
        *envelope,
        ("delivery_changed", "writer: attempt 1 started"),
        ("status_changed", "Received → In progress"),
        ("delivery_changed",
         f"writer: attempt 1 delivered: wrote acme/{written_as(name)} ({size} bytes)"),
        ("status_changed", "In progress → Delivered")]


# --- kill -9 while picking up ----------------------------------------------------------

ROUNDS = 3
PER_ROUND = 500


def round_files(n: int, rng: random.Random) -> dict[str, bytes]:
    """500 files of different content and sizes (0.1 to 3 KB)."""
    return {f"r{n}-{i:03d}.edi": f"ISA*round {n}*file {i}*".encode()
            + rng.randbytes(rng.randint(100, 3000)) for i in range(PER_ROUND)}


def taken_from(directory: Path, files: dict[str, bytes], at_least: int):
    """A check: at least ``at_least`` of ``files`` are gone from ``directory``."""
    return lambda: len(set(files) - set(os.listdir(directory))) >= at_least


def wait_for_pickup_rows(timeout: float) -> None:
    """Return as soon as a batch is committed, while its files are being removed."""
    deadline = time.monotonic() + timeout
    with db.engine.connect() as conn:
        while not conn.execute(select(func.count()).select_from(PollerPickup)).scalar():
            conn.rollback()
            assert time.monotonic() < deadline, "no batch committed"
            time.sleep(0.0005)


def test_kill_9_while_picking_up_stores_every_file_exactly_once(procs, session, inbox):
    """Rounds of 500 files; in each the process doing the poller's scans is killed
    (SIGKILL) while it picks them up and a new one started. Round 0 dies as soon as the
    first batch is committed (aiming between the commit and the removal of its files),
    the others at a random point of the third batch or the first half of the fourth
    (staging, commit or removal) of the scan's five."""
    save_settings(session, DeliverySettings(scan_lease_seconds=3))
    session.commit()
    load_fixtures(procs, inbox)  # no route: storing is what is under test
    scanner = procs.worker(queues="default")
    procs.beat()
    seed = random.randrange(1 << 30)
    print(f"random seed {seed}")
    rng, acme = random.Random(seed), inbox / "acme"
    dropped: dict[str, bytes] = {}
    kills, started = [], time.monotonic()
    for n in range(ROUNDS):
        files = round_files(n, rng)
        dropped.update(files)
        drop(inbox, files)
        if n == 0:
            wait_for_pickup_rows(60)
        else:
            wait_until(taken_from(acme, files, 1), 60, f"round {n} begun", every=0.01)
            begun = time.monotonic()
            wait_until(taken_from(acme, files, 101), 60, "a batch taken", every=0.01)
            time.sleep(rng.uniform(0, 1.5 * (time.monotonic() - begun)))
        scanner.signal(signal.SIGKILL)
        assert scanner.wait_exit(10) == -signal.SIGKILL
        kills.append((sum(name in files for name in os.listdir(acme)), count(PollerPickup),
                      round(time.monotonic() - started, 1)))
        scanner = procs.worker(queues="default", wait=False)
    print(f"(files of the round left, pickup rows, seconds) at each kill: {kills}")

    wait_until(lambda: not left_in(acme) and count(PollerPickup) == 0
               and count(Message) == len(dropped), 90, "every file stored")
    assert_stored_exactly_once(procs, dropped)
    assert left_in(inbox) == ["acme"]  # nothing was found unroutable
    print(f"all stored after {time.monotonic() - started:.1f} s")
    assert all(left > 0 for left, _, _ in kills), "a round was taken whole before the kill"


def assert_stored_exactly_once(procs: Processes, dropped: dict[str, bytes]) -> None:
    """One message per file, its payload the file's content, kept in the store."""
    stored = rows(select(Message.original_filename, Message.sha256, Payload.digest)
                  .join(Payload, Payload.message_id == Message.id)
                  .where(Payload.stage == "unpacked"))
    assert len(stored) == len(dropped)
    assert Counter(name for name, _, _ in stored) == Counter(dropped.keys())
    assert Counter(digest for _, _, digest in stored) == Counter(
        sha256(body) for body in dropped.values())
    store = PayloadStore(procs.payload_dir)
    for name, digest, payload in stored:
        assert digest == payload == sha256(dropped[name]), name
        with store.open(digest) as stream:
            assert stream.read() == dropped[name], name


# --- a writer that cannot write ---------------------------------------------------------

def test_a_writer_that_cannot_write_retries_fails_and_delivers_after_redeliver(
        procs, inbox, tmp_path):
    """Retrying with the reason and the time, Failed with ``message_failed`` once the
    (shortened) schedule is used up, then delivered after the directory is fixed and an
    operator redelivers through the REST API; the history names the operator."""
    blocker = tmp_path / "blocker"  # a regular file where a directory should be: the
    blocker.write_text("not a directory")  # write fails even as root (ENOTDIR)
    out = blocker / "out"
    load_fixtures(procs, inbox, writer={
        "config": {"base_directory": str(out), "filename_pattern": "{to}/{original_filename}"},
        "retry_policy": {"strategy": "schedule", "schedule": [1, 1, 1]}})
    token = procs.cli("token", "create", "ops-alice", "--role", "operator")
    assert token.returncode == 0, token.stderr
    worker = procs.worker(wait=False)
    web = procs.web()
    procs.beat()
    worker.wait_in_log(" ready.", timeout=60)
    body = SAMPLES[0].read_bytes()
    drop(inbox, {"order.edi": body})

    wait_until(lambda: delivery() and delivery().state == "retrying", 30, "retrying")
    reason = f"could not write acme/order.edi below {out}: Not a directory"
    assert_retrying_line(delivery().id, f"writer: attempt 1 failed: {reason}")

    wait_until(lambda: delivery().state == "failed", 40, "failed")
    failed = delivery()
    message_id = failed.message_id
    assert failed.attempt == 4
    assert rows(select(Message.status).where(Message.id == message_id)) == [("error",)]
    assert rows(select(Alert.kind).where(Alert.message_id == message_id,
                                         Alert.resolved_at.is_(None))) == [("message_failed",)]
    lines = history(message_id)
    attempts = [text for kind, _, text in lines
                if kind == "delivery_changed" and " failed: " in text]
    assert [t.split(";")[0] for t in attempts[:3]] == [
        f"writer: attempt {n} failed: {reason}" for n in (1, 2, 3)]
    assert attempts[3] == f"writer: attempt 4 failed: {reason} (attempts used up (4))"
    assert [text for kind, _, text in lines if kind == "status_changed"] == [
        "Received → In progress"] + ["In progress → Retrying",
                                     "Retrying → In progress"] * 3 + ["In progress → Error"]

    blocker.unlink()
    blocker.mkdir()  # fixed: the base directory can be made now
    resp = requests.post(f"{web.url}/api/v1/deliveries/{failed.id}/redeliver", timeout=10,
                         headers={"Authorization": f"Bearer {token.stdout.strip()}"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["changed"] is True

    wait_until(lambda: delivery().state == "delivered", 30, "delivered")
    assert (out / "acme" / "order.edi").read_bytes() == body
    assert rows(select(Message.status).where(Message.id == message_id)) == [("delivered",)]
    assert rows(select(Alert.kind).where(Alert.resolved_at.is_(None))) == []
    lines = history(message_id)
    asked = lines.index(("redeliver_requested", "ops-alice",
                         "ops-alice asked to redeliver the delivery to writer"))
    assert lines[asked + 1:asked + 3] == [
        ("delivery_changed", "ops-alice", "writer: queued (redeliver)"),
        ("status_changed", "ops-alice", "Error → Received")]
    assert [(kind, text) for kind, _, text in lines[asked + 3:]] == [
        ("delivery_changed", "writer: attempt 5 started"),
        ("status_changed", "Received → In progress"),
        ("delivery_changed", f"writer: attempt 5 delivered: wrote acme/order.edi "
                             f"({len(body)} bytes)"),
        ("status_changed", "In progress → Delivered")]


def delivery() -> Delivery | None:
    """The one delivery of the test, read afresh."""
    with Session(db.engine) as s:
        return s.scalars(select(Delivery)).one_or_none()


def assert_retrying_line(delivery_id: int, head: str) -> None:
    """The delivery's line ``head; retrying at <time> UTC`` is there, the time 1 s (the
    schedule's first delay) after the line was written, shown to the second."""
    [(text, written)] = rows(select(HistoryLine.text, HistoryLine.created_at).where(
        HistoryLine.delivery_id == delivery_id, HistoryLine.text.startswith(head, autoescape=True)))
    assert text.startswith(f"{head}; retrying at ") and text.endswith(" UTC"), text
    at = datetime.strptime(text[len(head) + len("; retrying at "):-len(" UTC")],
                           "%Y-%m-%d %H:%M:%S")
    assert timedelta(0) < at - written.replace(tzinfo=None) <= timedelta(seconds=1), text
