"""Web, two workers and beat as if on separate hosts (issue 21): each process has a
data directory of its own and nothing on disk is shared; they share only PostgreSQL,
Redis and an S3-compatible server on loopback (the payload store, ``s3://``), and one
``B2BHUB_SECRET_KEY``.

Files dropped at a poller on the first worker's "disk" and a message sent through the
web process are delivered byte-identical by a file_writer on the second worker's disk;
processes restarted with empty disks lose nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import requests
from pyas2lib import Mdn, Organization, Partner
from pyas2lib import Message as As2Message
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine.cleanup import run_cleanup
from b2bhub.models import Delivery, Message, Payload, utcnow
from plugins.as2 import profiles
from plugins.as2.plugin import As2Receiver
from plugins.file_writer import FileWriter
from plugins.http_receiver import HttpReceiver, create_token
from tests.as2kit import make_pair
from tests.factories import digests_in
from tests.procs import Processes, wait_until
from tests.s3kit import new_bucket
from tests.test_e2e_files import drop, load_fixtures

ON_SHARED_SERVICES = (os.environ.get("B2BHUB_TEST_DATABASE_URL", "").startswith("postgresql")
                      and os.environ.get("B2BHUB_TEST_BROKER_URL", "").startswith("redis"))

pytestmark = [
    pytest.mark.processes, pytest.mark.postgres,
    pytest.mark.skipif(not ON_SHARED_SERVICES, reason=(
        "needs PostgreSQL and Redis (B2BHUB_TEST_DATABASE_URL, B2BHUB_TEST_BROKER_URL): "
        "the embedded SQLite database and broker are files on one host, which processes "
        "on separate hosts cannot share")),
]

SECRET = "one key for every host of the deploy"


class Hosts:
    """Processes each with a data directory of its own ("its disk") and the S3 store."""

    def __init__(self, procs: Processes, tmp: Path, s3_env: dict[str, str]):
        self.procs, self.tmp, self.s3_env = procs, tmp, s3_env
        self.disks: dict[str, Path] = {}

    def env(self, host: str, **extra: str) -> dict[str, str]:
        disk = self.disks[host] = self.tmp / "hosts" / host
        disk.mkdir(parents=True, exist_ok=True)
        return {**self.s3_env, "B2BHUB_DATA_DIR": str(disk / "var"),
                "B2BHUB_PAYLOAD_DIR": str(disk / "var" / "payloads"),
                "B2BHUB_SECRET_KEY": SECRET, **extra}

    def wipe(self, host: str) -> None:
        """The host's disk is gone (a new dyno): everything but what the test put
        there as a partner's directory (``in``, ``out``)."""
        shutil.rmtree(self.disks[host] / "var", ignore_errors=True)

    def files_on_disks(self) -> list[Path]:
        """Every payload any process stored on its own disk (there must be none)."""
        return [p for disk in self.disks.values() for p in (disk / "var").rglob("*")
                if p.is_file() and "payloads" in p.parts]


@pytest.fixture
def hosts(procs, tmp_path, s3_server):
    bucket = new_bucket()
    s3_server.store(bucket).client.create_bucket(Bucket=bucket)
    hosts = Hosts(procs, tmp_path, s3_server.env(bucket))
    hosts.store = s3_server.store(bucket)
    return hosts


def count_messages() -> int:
    with Session(db.engine) as s:
        return s.scalar(select(func.count()).select_from(Message))


def delivery_states() -> dict[str, int]:
    with Session(db.engine) as s:
        return {state: n for state, n in s.execute(
            select(Delivery.state, func.count()).group_by(Delivery.state))}


def send(web_url: str, token: str, name: str, body: bytes) -> int:
    answer = requests.post(f"{web_url}/api/v1/messages", timeout=60,
                           headers={"Authorization": f"Bearer {token}"},
                           data={"from": "mycompany", "to": "acme", "target": "writer"},
                           files={"file": (name, body)})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def pattern(size: int, seed: bytes) -> bytes:
    block = hashlib.sha256(seed).digest() * 2048
    return (block * (size // len(block) + 1))[:size]


def test_processes_on_separate_disks_deliver_everything_through_the_object_store(
        hosts, procs, session, s3_server):
    from b2bhub.services.tokens import create_token

    inbox = hosts.tmp / "hosts" / "worker1" / "in"  # the poller's directory: worker1's
    out = hosts.tmp / "hosts" / "worker2" / "out"  # the writer's directory: worker2's
    token = create_token(session, "tests", "admin")
    session.commit()
    load_fixtures(procs, inbox, writer={"queue": "host2", "config": {
        "base_directory": str(out), "filename_pattern": "{to}/{original_filename}"}})

    web = procs.web(extra_env=hosts.env("web"))
    worker1 = procs.worker(extra_env=hosts.env("worker1"), queues="deliveries,default")
    worker2 = procs.worker(extra_env=hosts.env("worker2", B2BHUB_WORKER_QUEUES="host2"),
                           queues="host2")
    procs.beat(extra_env=hosts.env("beat"))

    # a 12 MiB file goes up in parts (multipart upload), from the worker that took it
    dropped = {f"order-{i}.edi": f"UNB+{i}'\n".encode() * (i + 1) for i in range(8)}
    dropped["big.bin"] = pattern(12 * 1024 * 1024, b"big")
    dropped["empty.txt"] = b""
    drop(inbox, dropped)
    sent = {"by-hand.xml": b"<order>by hand</order>",
            "by-hand-big.bin": pattern(9 * 1024 * 1024, b"web")}
    for name, body in sent.items():
        send(web.url, token, name, body)
    expected = {**dropped, **sent}

    wait_until(lambda: delivery_states() == {"delivered": len(expected)}, 120,
               "every message delivered by the other worker")
    for name, body in expected.items():
        assert (out / "acme" / name).read_bytes() == body, name
    assert hosts.files_on_disks() == []
    stored = set(digests_in(hosts.store))
    assert {hashlib.sha256(b).hexdigest() for b in expected.values()} <= stored

    # Worker2 is down while more arrive; then every process starts again on an empty
    # disk, and nothing is lost.
    worker2.stop()
    later = {f"later-{i}.edi": f"UNB+later{i}'\n".encode() * 50 for i in range(5)}
    later["later-big.bin"] = pattern(11 * 1024 * 1024, b"later")
    drop(inbox, later)
    later_sent = {"later-by-hand.txt": b"sent while the writer's host was down"}
    later_ids = [send(web.url, token, n, b) for n, b in later_sent.items()]
    total = len(expected) + len(later) + len(later_sent)
    wait_until(lambda: count_messages() == total, 60, "the later messages stored")
    for proc in (worker1, web):
        proc.stop()
    for host in ("web", "worker1", "worker2"):
        hosts.wipe(host)

    web = procs.web(extra_env=hosts.env("web"))
    procs.worker(extra_env=hosts.env("worker1"), queues="deliveries,default")
    procs.worker(extra_env=hosts.env("worker2", B2BHUB_WORKER_QUEUES="host2"),
                 queues="host2")
    wait_until(lambda: delivery_states() == {"delivered": total}, 120,
               "the later messages delivered after the restarts")
    for name, body in {**expected, **later, **later_sent}.items():
        assert (out / "acme" / name).read_bytes() == body, name
    # the restarted web process, its disk empty, hands out what another process stored
    answer = requests.get(f"{web.url}/api/v1/messages/{later_ids[0]}/payload",
                          headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 200 and answer.content == later_sent["later-by-hand.txt"]
    assert hosts.files_on_disks() == []


def parts_sent(store) -> int:
    """Parts the unfinished multipart uploads of the store have so far."""
    return sum(len(store.client.list_parts(Bucket=store.bucket, Key=u["Key"],
                                           UploadId=u["UploadId"]).get("Parts", []))
               for u in store.temp_uploads())


def test_kill_9_of_a_worker_in_the_middle_of_a_multipart_upload(hosts, procs):
    """The worker taking a large file is killed while its parts go up: no row refers to
    anything of it, the file is taken again by the restarted worker and delivered once,
    and the orphan cleanup aborts the abandoned upload (its parts) past its margin."""
    inbox = hosts.tmp / "hosts" / "worker1" / "in"
    out = hosts.tmp / "hosts" / "worker2" / "out"
    load_fixtures(procs, inbox, writer={"queue": "host2", "config": {
        "base_directory": str(out), "filename_pattern": "{to}/{original_filename}"}})
    worker1 = procs.worker(extra_env=hosts.env("worker1"), queues="deliveries,default")
    procs.worker(extra_env=hosts.env("worker2", B2BHUB_WORKER_QUEUES="host2"),
                 queues="host2")
    procs.beat(extra_env=hosts.env("beat"))
    body = pattern(160 * 1024 * 1024, b"huge")
    drop(inbox, {"huge.bin": body})

    wait_until(lambda: parts_sent(hosts.store) >= 1, 60, "the first parts sent", every=0.05)
    os.kill(worker1.pid, signal.SIGKILL)
    worker1.wait_exit(10)
    [abandoned] = hosts.store.temp_uploads()
    assert count_messages() == 0
    assert list(digests_in(hosts.store)) == [] and hosts.store.temp_objects() == []

    hosts.wipe("worker1")
    procs.worker(extra_env=hosts.env("worker1"), queues="deliveries,default")
    wait_until(lambda: delivery_states() == {"delivered": 1}, 180,
               "the file taken again and delivered")
    assert (out / "acme" / "huge.bin").read_bytes() == body
    assert count_messages() == 1
    with Session(db.engine) as s:
        referenced = set(s.scalars(select(Payload.digest)))
    assert referenced == {hashlib.sha256(body).hexdigest()}

    with Session(db.engine) as s:  # the nightly cleanup: the upload may be under way
        assert run_cleanup(s, hosts.store, utcnow(), "tests").files == 0
    assert [u["UploadId"] for u in hosts.store.temp_uploads()] == [abandoned["UploadId"]]
    hosts.store.clock = lambda: time.time() + 25 * 3600  # a day later: past its margin
    with Session(db.engine) as s:
        report = run_cleanup(s, hosts.store, utcnow(), "tests")
    assert (report.ran, report.messages, report.files) == (True, 0, 0)
    assert hosts.store.temp_uploads() == [] and hosts.store.temp_objects() == []
    assert sorted(digests_in(hosts.store)) == sorted(referenced)


def test_as2_and_http_intake_at_the_web_host_are_delivered_by_another_host(
        hosts, procs, hub, session, registry):
    """The web process takes an AS2 message (signed, encrypted, a signed receipt asked
    for) and an HTTP intake on its own disk-less host; the worker of the other host
    delivers both from the object store, byte-identical, and no host keeps a file."""
    registry.register(As2Receiver)
    registry.register(HttpReceiver)
    registry.register(FileWriter)
    out = hosts.tmp / "hosts" / "worker2" / "out"
    ours, theirs = make_pair("hub.example"), make_pair("acme.example")
    hub.parties()
    profiles.save_profile(session, "organization", "mycompany", {
        "as2_id": "HUB", "certificate": {"pem": ours[0], "private_key_pem": ours[1]}})
    profiles.save_profile(session, "partner", "acme", {
        "as2_id": "ACME", "url": "http://127.0.0.1:9/as2", "mdn_mode": "none",
        "certificate": {"pem": theirs[0]}})
    hub.instance("as2in", "as2_receiver")
    hub.instance("inbox", "http_receiver", config={"from_party": "acme",
                                                    "to_party": "mycompany"})
    hub.instance("writer", "file_writer", queue="host2", config={
        "base_directory": str(out), "filename_pattern": "{source}/{original_filename}"})
    for source in ("as2in", "inbox"):
        hub.route(source, "*", "*", "writer")
    token = create_token(session, "inbox", "client", "tests")
    session.commit()

    web = procs.web(extra_env=hosts.env("web"))
    procs.worker(extra_env=hosts.env("worker2", B2BHUB_WORKER_QUEUES="host2"),
                 queues="host2,deliveries,default")
    procs.beat(extra_env=hosts.env("beat"))

    # CRLF line ends: pyas2lib, the partner here, sends text as 7bit with CRLF
    edi = b"ISA*00*          *00*          *ZZ*ACME~\r\nGS*PO*ACME*HUB~\r\n" * 4000
    key = (theirs[1] + theirs[0]).encode()
    partner_side = As2Message(
        Organization(as2_name="ACME", sign_key=key, decrypt_key=key),
        Partner(as2_name="HUB", verify_cert=ours[0].encode(), encrypt_cert=ours[0].encode(),
                validate_certs=False, sign=True, encrypt=True, enc_alg="aes_256_cbc",
                mdn_mode="SYNC", mdn_digest_alg="sha256"))
    partner_side.build(edi, filename="orders.edi", content_type="application/edi-x12")
    answer = requests.post(f"{web.url}/as2/as2in", data=partner_side.content, timeout=60,
                           headers=dict(partner_side.headers))
    assert answer.status_code == 200, answer.text
    mdn = Mdn()
    status, detail = mdn.parse(
        b"".join(f"{k}: {v}\r\n".encode() for k, v in answer.headers.items()) + b"\r\n"
        + answer.content, lambda *_: partner_side)
    assert status == "processed", detail

    json_doc = pattern(3 * 1024 * 1024, b"http intake")  # large enough for parts
    answer = requests.post(f"{web.url}/in/inbox", data=json_doc, timeout=60, headers={
        "Authorization": f"Bearer {token}", "X-B2BHub-Filename": "prices.json"})
    assert answer.status_code == 202, answer.text

    wait_until(lambda: delivery_states() == {"delivered": 2}, 120,
               "both delivered by the other host's worker")
    assert (out / "as2in" / "orders.edi").read_bytes() == edi
    assert (out / "inbox" / "prices.json").read_bytes() == json_doc
    assert hosts.files_on_disks() == []
    with Session(db.engine) as s:
        referenced = set(s.scalars(select(Payload.digest)))
    assert {hashlib.sha256(edi).hexdigest(), hashlib.sha256(json_doc).hexdigest()} \
        <= referenced <= set(digests_in(hosts.store))
