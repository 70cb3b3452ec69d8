"""AS2 both ways between the hub and a partner simulated with pyas2lib in a separate
process on loopback, for every combination of signing, encryption, compression and MDN
(none, sync, async; signed and unsigned); partner quirks; bad input; Receipt Timeout.

The hub runs in this process (its Flask app served on a loopback port in a thread, the
sender attempted by a TargetRunner here); the partner process is started once per module.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pyas2lib
import pytest
import requests
from sqlalchemy import event, select, update
from sqlalchemy.engine import Engine

from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
from b2bhub.engine.machine.receipts import fail_overdue_receipts
from b2bhub.engine.runner import TargetRunner
from b2bhub.models import (
    Alert,
    Delivery,
    HistoryLine,
    Message,
    Payload,
    PluginInstance,
    utcnow,
)
from b2bhub.payloads.store import PayloadBatch, PayloadStore
from b2bhub.plugin import PREREAD
from b2bhub.runtime.hub import new_session
from b2bhub.services.profiles import check_certificates
from plugins.as2 import lib, profiles, stream
from plugins.as2.mdn_out import send_due_mdns
from plugins.as2.plugin import As2Receiver, As2Sender
from plugins.as2.receiver import SMALL_STAGE
from tests.as2kit import make_pair
from tests.enginekit import counted_statements
from tests.test_edi_inspect import x12

ROOT = Path(__file__).resolve().parent.parent
#: the receiver instance, the profiles and routes versions, the delivery settings and a
#: replay in one (the profiles cached), then message, payloads, deliveries (+ their
#: sequence numbers), history, the as2_inbound row (these five one statement on
#: PostgreSQL)
STATEMENTS_PER_RECEIVE = 7
#: a well-formed X12 interchange (DATA's envelope is cut short: an envelope error)
INTERCHANGE = x12()
DATA = b"ISA*00*          *00*          *ZZ*ACME~GS*PO*ACME*HUB~ST*850*0001~SE*2*0001~\r\n"


@pytest.fixture(scope="module")
def certs(as2_certs):
    """The hub's, acme's and an intruder's certificate and key (PEM): the run's, made
    once (``as2_certs``), in a dict of the module's own."""
    return dict(as2_certs)


@pytest.fixture(scope="module")
def partner(certs, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("partner") / "partner.json"
    cfg.write_text(json.dumps({"as2_id": "ACME", "cert": certs["acme"][0],
                               "key": certs["acme"][1], "hub_as2_id": "HUB",
                               "hub_cert": certs["hub"][0]}))
    proc = subprocess.Popen([sys.executable, "-m", "tests.as2_partner", str(cfg)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    yield Partner(f"http://127.0.0.1:{port}")
    proc.terminate()
    proc.wait(10)


class Partner:
    def __init__(self, url: str):
        self.url = url

    def configure(self, **config):
        requests.post(self.url + "/config", json=config, timeout=10).raise_for_status()

    def send(self, hub_url: str, data: bytes = DATA, **order) -> dict:
        order = {"data": base64.b64encode(data).decode(), "hub_url": hub_url, **order}
        answer = requests.post(self.url + "/send", json=order, timeout=60)
        answer.raise_for_status()
        return answer.json()

    def received(self) -> list[dict]:
        return requests.get(self.url + "/received", timeout=10).json()

    def mdns(self) -> list[dict]:
        return requests.get(self.url + "/mdns", timeout=10).json()

    def release_async(self) -> int:
        """Post the async MDNs held back (a partner that answers late)."""
        return requests.post(self.url + "/release", timeout=30).json()["posted"]


#: ``as2`` parametrized indirectly with this runs the hub's AS2 on the streaming path
#: (plugins.as2.stream) for every message, receiving and sending
STREAMED = "streamed"


@pytest.fixture
def as2(request, hub, registry, session, certs, partner, served, monkeypatch):
    streamed = getattr(request, "param", None) == STREAMED
    threshold = {"stream_threshold": 0} if streamed else {}
    registry.register(As2Receiver)
    registry.register(As2Sender)
    hub.parties(organizations=("mycompany",), partners=("acme",))
    profiles.save_profile(session, "organization", "mycompany", {
        "as2_id": "HUB", "mdn_url": served + "/as2/as2in",
        "certificate": {"pem": certs["hub"][0], "private_key_pem": certs["hub"][1]}})
    profiles.save_profile(session, "partner", "acme", {
        "as2_id": "ACME", "url": partner.url + "/as2", "receipt_timeout": 3600,
        "certificate": {"pem": certs["acme"][0]}})
    session.commit()
    hub.instance("as2in", "as2_receiver", enabled=True,
                 config={"max_size": 1 << 20, **threshold})
    hub.instance("as2out", "as2_sender", enabled=True, config=threshold)
    hub.instance("sink", "noop", enabled=True)
    hub.route("as2in", "*", "*", "sink")
    setup = Setup(hub, session, partner, served)
    setup.streamed = streamed
    for name in ("receive", "build"):  # which messages took the streaming path
        real = getattr(stream, name)
        monkeypatch.setattr(stream, name, lambda *a, _real=real, _name=name, **k: (
            setup.streams.append(_name), _real(*a, **k))[1])
    return setup


class Setup:
    def __init__(self, hub, session, partner, served):
        self.hub, self.session, self.partner, self.served = hub, session, partner, served
        self.url = served + "/as2/as2in"
        self.streamed, self.streams = False, []

    def choose(self, **choices):
        profiles.save_profile(self.session, "partner", "acme", choices)
        self.session.commit()

    def messages(self) -> list[Message]:
        self.session.expire_all()
        return list(self.session.scalars(select(Message).order_by(Message.id)))

    def stages(self, message_id: int) -> dict[str, bytes]:
        rows = self.session.scalars(select(Payload).where(Payload.message_id == message_id))
        out = {}
        for p in rows:
            with self.hub.store.open(p.digest) as f:
                out[p.stage] = f.read()
        return out

    def lines(self, message_id: int, type_: str | None = None) -> list[str]:
        query = select(HistoryLine.text).where(HistoryLine.message_id == message_id)
        if type_:
            query = query.where(HistoryLine.type == type_)
        return list(self.session.scalars(query.order_by(HistoryLine.id)))

    def outbound(self, body: bytes = DATA) -> Message:
        stored = self.hub.store.put(body)
        message = store_and_dispatch(self.session, NewMessage(
            source="@operator", from_party="mycompany", to_party="acme",
            stages={"unpacked": (stored.digest, stored.size)}, original_filename="po.edi",
            targets=["as2out"]), utcnow())
        self.session.commit()
        return message

    def drain(self, clock=utcnow):
        TargetRunner(new_session, self.hub.registry, self.hub.store, "test-worker",
                     clock=clock).drain("as2out", budget=60)

    def delivery(self, message_id: int) -> Delivery:
        self.session.expire_all()
        return self.session.scalar(select(Delivery).where(Delivery.message_id == message_id))


def wait_for(check, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


MDNS = [("none", False), ("sync", False), ("sync", True), ("async", False), ("async", True)]
MATRIX = [(s, e, c, m, ms) for s, e, c in itertools.product((False, True), repeat=3)
          for m, ms in MDNS]


def _ids(case):
    s, e, c, m, ms = case
    return "-".join(filter(None, ("signed" if s else "plain", "enc" if e else "clear",
                                  "zip" if c else "raw", m, "smdn" if ms and m != "none"
                                  else "")))


#: the matrix on both paths: pyas2lib in memory, and streamed through temp files
PATHS = pytest.mark.parametrize("as2", ["memory", STREAMED], indirect=True)


@PATHS
@pytest.mark.parametrize("case", MATRIX, ids=[_ids(c) for c in MATRIX])
def test_partner_to_hub(as2, case):
    sign, encrypt, compress, mode, mdn_signed = case
    as2.choose(sign=sign, encrypt=encrypt, compress=compress)
    before = len(as2.partner.mdns())
    result = as2.partner.send(as2.url, sign=sign, encrypt=encrypt, compress=compress,
                              mdn_mode=mode if mode != "none" else None,
                              mdn_signed=mdn_signed, filename="po.edi")
    assert result["http_status"] == 200, result
    [message] = as2.messages()
    assert message.status == "received" and message.from_party == "acme"
    assert message.to_party == "mycompany" and message.external_id == result["message_id"]
    assert message.original_filename == "po.edi"
    # the AS2 Message-ID is the message's correlation id too (SPEC 11)
    assert message.correlation_id == result["message_id"]
    stages = as2.stages(message.id)
    assert stages["unpacked"] == DATA
    assert stages["raw"].lower().count(b"as2-from:") == 1
    assert as2.streams == (["receive"] if as2.streamed else [])
    if mode == "sync":
        assert result["mdn_status"] == "processed", result
        assert result["mdn_signed"] is mdn_signed
        assert b"processed" in stages["receipt"]
    elif mode == "async":
        assert send_due_mdns(as2.session, as2.hub.store, utcnow()) == 1
        mdns = wait_for(lambda: as2.partner.mdns()[before:])
        assert [m["status"] for m in mdns] == ["processed"], mdns
        assert as2.lines(message.id, "mdn_sent")
    else:
        assert "receipt" not in stages


@PATHS
@pytest.mark.parametrize("case", MATRIX, ids=[_ids(c) for c in MATRIX])
def test_hub_to_partner(as2, case):
    sign, encrypt, compress, mode, mdn_signed = case
    # pyas2lib (as django-pyas2 uses it) signs the receipt of an unsigned message without
    # a Received-Content-MIC: accepted only with the partner's option, with a warning
    no_mic = mdn_signed and not sign and mode != "none"
    as2.choose(sign=sign, encrypt=encrypt, compress=compress, mdn_mode=mode,
               mdn_signed=mdn_signed, accept_mdn_without_mic=no_mic)
    seen = len(as2.partner.received())
    message = as2.outbound()
    as2.drain()
    [got] = as2.partner.received()[seen:]
    assert got["status"] == "processed", got
    assert base64.b64decode(got["content"]) == DATA
    assert (got["signed"], got["encrypted"], got["compressed"]) == (sign, encrypt, compress)
    if mode == "async":
        assert as2.delivery(message.id).state in ("awaiting_receipt", "delivered")
        assert wait_for(lambda: as2.delivery(message.id).state == "delivered")
    else:
        assert as2.delivery(message.id).state == "delivered", as2.delivery(
            message.id).last_result
    result = as2.delivery(message.id).last_result
    if mode != "none":
        assert ("warning: signed MDN without Received-Content-MIC" in result) is no_mic
        assert ("MIC verified" in result) is sign, result  # pyas2lib: MIC if signed
    stages = as2.stages(message.id)
    assert stages["unpacked"] == DATA and b"as2-to:" in stages["sent"].lower()
    assert ("receipt" in stages) is (mode != "none")
    assert as2.streams == (["build"] if as2.streamed else [])


# --- duplicates, quirks, bad input, Receipt Timeout ------------------------------------

@PATHS
def test_replayed_message_id_gets_the_stored_receipt_and_no_new_message(as2, monkeypatch):
    as2.choose(sign=True, encrypt=True)
    first = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                             mdn_signed=True, message_id="replay-1")
    again = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                             mdn_signed=True, message_id="replay-1")
    files = sorted(p for p in Path(as2.hub.store.root).rglob("*") if p.is_file())
    writes = []
    monkeypatch.setattr(PayloadBatch, "put", lambda *a, **k: writes.append(a))
    third = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                             mdn_signed=True, message_id="replay-1")
    assert first["mdn_status"] == again["mdn_status"] == third["mdn_status"] == "processed"
    [message] = as2.messages()
    assert len(as2.lines(message.id, "duplicate_received")) == 2
    # no payload written for a replay, not even a temp file
    assert not writes
    assert sorted(p for p in Path(as2.hub.store.root).rglob("*") if p.is_file()) == files


@pytest.mark.parametrize("since", ["process_started", "profile_saved"])
def test_a_replay_is_found_whatever_this_process_knows_of_the_partner(as2, since):
    """The replay lookup goes with the statement that reads the profiles version, by
    the partner this process had cached; a process that knows no partner yet (a new
    one), or one whose partner profile changed since, still finds the replay."""
    as2.choose(sign=True, encrypt=True)
    first = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                             mdn_signed=True, message_id="replay-2")
    if since == "process_started":
        profiles.profile_cache.clear()
    else:
        as2.choose(receipt_timeout=7200)  # a new profiles version
    again = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                             mdn_signed=True, message_id="replay-2")
    assert first["mdn_status"] == again["mdn_status"] == "processed", again
    [message] = as2.messages()
    assert len(as2.lines(message.id, "duplicate_received")) == 1


@pytest.mark.parametrize("size", [len(DATA), PREREAD + 1])
@pytest.mark.parametrize("instance", ["nobody", "off"])
def test_an_unknown_or_disabled_receiver_answers_404_and_stores_nothing(as2, size,
                                                                         instance):
    as2.hub.instance("off", "as2_receiver", enabled=False)
    answer = requests.post(as2.served + f"/as2/{instance}", data=b"x" * size, timeout=30,
                           headers={"AS2-From": "ACME", "AS2-To": "HUB",
                                    "Message-ID": "<to-nobody@acme>"})
    assert answer.status_code == 404, answer.text
    assert answer.text == f"no enabled AS2 receiver named '{instance}'\n"
    assert as2.messages() == []


def send_signed(as2) -> dict:
    """The partner sends a signed and encrypted message asking for a signed sync MDN."""
    return as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                            mdn_signed=True)


def set_checks(as2, **checks) -> None:
    """The receiver instance's intake checks (docs/edi.md "Checks at intake")."""
    as2.session.execute(update(PluginInstance).where(PluginInstance.name == "as2in")
                        .values(**checks))
    as2.session.commit()


def send_counted(as2, data: bytes) -> tuple[dict, dict]:
    """The partner's result of sending ``data`` and the statements the hub ran for it."""
    with counted_statements(Engine) as seen:
        result = as2.partner.send(as2.url, data=data, sign=True, encrypt=True,
                                  mdn_mode="sync", mdn_signed=True, filename="po.edi")
    assert result["mdn_status"] == "processed", result
    return result, seen


def test_a_received_message_is_stored_in_few_statements(as2):
    """The message row carries its direction and the MDN line goes in with the intake's
    history lines: no read-back, no UPDATE, no separate lookups after the insert."""
    as2.choose(sign=True, encrypt=True)
    # a well-formed interchange (no edi_errors line), sent twice: the duplicate check is
    # off, as its lookup is one SELECT more (counted by
    # test_the_duplicate_check_costs_one_select_per_interchange)
    set_checks(as2, duplicate_days=0)
    as2.partner.send(as2.url, data=INTERCHANGE, sign=True, encrypt=True, mdn_mode="sync",
                     mdn_signed=True)
    _result, seen = send_counted(as2, INTERCHANGE)
    assert seen["UPDATE"] == 0, seen  # every row goes in with its INSERT
    # an X12 interchange: its envelope's attributes (message_attributes rows) and the
    # job of the acknowledgment its partner may be due (edi_ack_jobs) go in with the
    # message, in the one statement on PostgreSQL; SQLite writes each kind of row with
    # an INSERT of its own, so there they are two more
    envelope_rows = 2 if as2.session.get_bind().dialect.name == "sqlite" else 0
    assert sum(seen.values()) <= STATEMENTS_PER_RECEIVE - 1 + envelope_rows, seen
    assert seen["SELECT"] == 1, seen  # the lookups before the parse are one statement
    if as2.session.get_bind().dialect.name == "postgresql":  # the rest is one too, the
        assert seen == {"SELECT": 1, "WITH": 1}, seen  # as2_inbound row with the message
    message = as2.messages()[-1]
    assert message.direction == "inbound" and message.status == "received"
    assert [(t, x) for t, x in as2.session.execute(
        select(HistoryLine.type, HistoryLine.text).where(
            HistoryLine.message_id == message.id).order_by(HistoryLine.id))] == [
        ("received", "po.edi received from acme for mycompany by as2in"),
        ("delivery_changed", "sink: queued"),
        ("mdn_sent", "signed MDN returned in the response")]


def test_the_lookups_of_a_received_message_run_without_begin(as2):
    """On PostgreSQL the lookups before the parse run as a transaction of their own
    (autocommit: no BEGIN round trip); the rows of a message, accepted (one statement)
    or refused (its message, its as2_inbound row), then go in a transaction, as
    everything does on SQLite."""
    as2.choose(sign=True, encrypt=True)
    set_checks(as2, duplicate_days=0)
    seen: list[tuple[str, bool]] = []

    def before(conn, cursor, statement, params, context, executemany):
        alone = getattr(cursor.connection, "autocommit", False) is True  # psycopg's
        seen.append((statement.split()[0].upper(), alone))

    send_counted(as2, INTERCHANGE)  # warm: plans, caches, the partner's features noted
    event.listen(Engine, "before_cursor_execute", before)
    try:
        send_counted(as2, INTERCHANGE)
        accepted, seen[:] = list(seen), []
        refused = as2.partner.send(as2.url, data=INTERCHANGE, sign=False, encrypt=True,
                                   mdn_mode="sync", mdn_signed=True)
    finally:
        event.remove(Engine, "before_cursor_execute", before)
    assert refused["mdn_status"] != "processed", refused
    if as2.session.get_bind().dialect.name == "postgresql":
        assert accepted == [("SELECT", True), ("WITH", False)], accepted
    else:
        assert not any(alone for _word, alone in accepted), accepted
    writes = [(word, alone) for word, alone in seen if word in ("WITH", "INSERT", "UPDATE")]
    assert len(writes) > 1 and not any(alone for _word, alone in writes), seen
    assert [m.status for m in as2.messages()[-3:]] == ["received", "received", "refused"]


def test_the_duplicate_check_costs_one_select_per_interchange(as2):
    """With the duplicate check on (the default), an interchange's receive costs exactly
    one SELECT more, and a second copy gets duplicate_received and its alert."""
    as2.choose(sign=True, encrypt=True)
    set_checks(as2, duplicate_days=0)
    send_counted(as2, x12(control="000000201"))  # warm: plans, caches
    _result, off = send_counted(as2, x12(control="000000202"))
    set_checks(as2, duplicate_days=30)
    send_counted(as2, x12(control="000000203"))  # warm: the lookup's plan
    _result, on = send_counted(as2, x12(control="000000204"))
    # one read more (a SELECT starting WITH its control numbers), every write the same
    reads = ("SELECT", "WITH")
    assert sum(on.get(k, 0) for k in reads) == sum(off.get(k, 0) for k in reads) + 1, (
        on, off)
    assert {k: v for k, v in on.items() if k not in reads} == {
        k: v for k, v in off.items() if k not in reads}, (on, off)

    send_counted(as2, x12(control="000000204"))
    first, second = as2.messages()[-2:]
    text = f"interchange 000000204 from ZZ:MYCOMPANY was received before as message {first.id}"
    lines = [(t, x) for t, x in as2.session.execute(
        select(HistoryLine.type, HistoryLine.text).where(
            HistoryLine.message_id == second.id).order_by(HistoryLine.id))]
    assert ("duplicate_received", text) in lines
    assert second.status == "received"  # let through: duplicates "alert", the default
    assert [(a.subject, a.message_id) for a in as2.session.scalars(select(Alert).where(
        Alert.kind == "duplicate_received"))] == [(f"message:{second.id}", second.id)]


def test_the_hub_signs_its_mdns_and_messages_through_openssl(as2, monkeypatch):
    """pyas2lib's own signer is not called for a signed MDN or a signed message with a
    SHA-2 digest, and the partner (pyas2lib alone) verifies both."""
    by_pyas2lib = []
    real = lib._real_sign_message
    monkeypatch.setattr(lib, "_real_sign_message",
                        lambda *a, **k: by_pyas2lib.append(a) or real(*a, **k))
    as2.choose(sign=True, encrypt=True, digest_alg="sha384", mdn_mode="sync",
               mdn_signed=True)
    assert send_signed(as2)["mdn_status"] == "processed"
    seen = len(as2.partner.received())
    message = as2.outbound()
    as2.drain()
    assert as2.delivery(message.id).state == "delivered", as2.delivery(message.id).last_result
    [got] = as2.partner.received()[seen:]
    assert got["status"] == "processed" and got["signed"], got
    assert by_pyas2lib == []


def test_the_stages_of_a_message_are_made_durable_once_before_its_commit(as2, monkeypatch):
    as2.choose(sign=True, encrypt=True)
    events: list[str] = []
    commit = PayloadBatch.commit

    def durable(batch):
        commit(batch)
        events.append(f"durable {len(list(Path(batch.store.root, 'tmp').iterdir()))} left")

    monkeypatch.setattr(PayloadBatch, "commit", durable)
    monkeypatch.setattr(PayloadStore, "put", lambda *a, **k: events.append("put"))
    on_commit = lambda *_a: events.append("commit")  # noqa: E731
    event.listen(Engine, "commit", on_commit)
    try:
        result = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                                  mdn_signed=True)
    finally:
        event.remove(Engine, "commit", on_commit)
    assert result["mdn_status"] == "processed", result
    assert "put" not in events and events.count("durable 0 left") == 1, events
    assert events[-2:] == ["durable 0 left", "commit"], events
    [message] = as2.messages()
    assert set(as2.stages(message.id)) == {"raw", "unpacked", "receipt"}


@pytest.mark.parametrize("size", [len(DATA), SMALL_STAGE + 1])
def test_small_stages_are_written_with_the_sync_and_a_large_raw_one_while_parsing(
        as2, monkeypatch, size):
    """The request's thread only hashes a small stage: the writer thread writes the
    small ones with the sync, in one job. A large raw stage is written on a writer
    thread while the message is parsed, a large unpacked one by the request's thread
    as it comes. All are stored the same way."""
    as2.choose(sign=True, encrypt=True)
    writers: list[str] = []
    put, commit = PayloadBatch.put, PayloadBatch.commit

    def recorded(batch, data, *args, **kwargs):
        writers.append(threading.current_thread().name)
        return put(batch, data, *args, **kwargs)

    def committed(batch):
        writers.append(f"sync on {threading.current_thread().name}")
        return commit(batch)

    monkeypatch.setattr(PayloadBatch, "put", recorded)
    monkeypatch.setattr(PayloadBatch, "commit", committed)
    result = as2.partner.send(as2.url, data=DATA * (size // len(DATA) + 1), sign=True,
                              encrypt=True, mdn_mode="sync", mdn_signed=True)
    assert result["mdn_status"] == "processed", result
    raw, unpacked, receipt, sync = writers
    assert raw.startswith("as2-store") and sync == f"sync on {receipt}", writers
    if size <= SMALL_STAGE:  # raw, unpacked and receipt in the sync's job
        assert raw == unpacked == receipt, writers
    else:  # the raw one while parsing, the unpacked one on the request's thread
        assert not unpacked.startswith("as2-store") and receipt != unpacked, writers
    [message] = as2.messages()
    assert set(as2.stages(message.id)) == {"raw", "unpacked", "receipt"}
    assert as2.stages(message.id)["unpacked"] == DATA * (size // len(DATA) + 1)


@pytest.mark.parametrize("size", [len(DATA), PREREAD + 1])
def test_a_request_holds_no_connection_while_a_large_body_arrives(as2, app, size):
    """A small body is read first and the request checks out one connection; a large
    one is read once the instance lookup gave its connection back, then takes another."""
    as2.choose(sign=True, encrypt=True)
    send_signed(as2)
    checkouts = []
    pool = app.extensions["sqlalchemy"].engines[None].pool
    on_checkout = lambda *_a: checkouts.append(threading.current_thread().name)  # noqa: E731
    event.listen(pool, "checkout", on_checkout)
    try:
        result = as2.partner.send(as2.url, data=DATA * (size // len(DATA) + 1), sign=True,
                                  encrypt=True, mdn_mode="sync", mdn_signed=True)
    finally:
        event.remove(pool, "checkout", on_checkout)
    assert result["mdn_status"] == "processed", result
    assert len(checkouts) == (1 if size <= PREREAD else 2), checkouts
    assert as2.messages()[-1].status == "received"


def test_a_profile_saved_elsewhere_applies_to_the_next_message(as2, certs):
    """The receiver keeps profiles with their loaded keys and certificates per process;
    a save in another session (as another process would make it) is seen at once."""
    as2.choose(sign=True, encrypt=True)
    assert send_signed(as2)["mdn_status"] == "processed"
    for pem, expected in ((certs["other"][0], False), (certs["acme"][0], True)):
        with new_session() as other:
            profiles.save_profile(other, "partner", "acme", {"certificate": {"pem": pem}})
            other.commit()
        answer = send_signed(as2)
        assert (answer["mdn_status"] == "processed") is expected, answer
    with new_session() as other:
        profiles.save_profile(other, "partner", "acme", {"as2_id": "ACME2"})
        other.commit()
    answer = send_signed(as2)  # still signed AS2-From: ACME, no longer anyone's AS2 ID
    assert answer["mdn_status"] != "processed", answer
    messages = as2.messages()
    assert [m.status for m in messages] == ["received", "refused", "received", "refused"]
    assert messages[-1].from_party == "ACME"  # an unknown AS2 ID is recorded as itself


def test_wakeups_are_published_after_the_commit_once_the_response_is_sent(as2, app, certs):
    as2.choose(sign=True, encrypt=True)
    key = (certs["acme"][1] + certs["acme"][0]).encode()
    message = pyas2lib.Message(
        pyas2lib.Organization(as2_name="ACME", sign_key=key, decrypt_key=key),
        pyas2lib.Partner(as2_name="HUB", verify_cert=certs["hub"][0].encode(),
                         encrypt_cert=certs["hub"][0].encode(), validate_certs=False,
                         sign=True, encrypt=True, mdn_mode="SYNC", mdn_digest_alg="sha256"))
    message.build(DATA, filename="po.edi")
    published = []

    def publish(items):  # what another process sees of the deliveries when woken
        with new_session() as other:
            published.append([(other.scalar(select(Delivery.state).where(
                Delivery.id == delivery_id)), target) for delivery_id, target in items])

    previous = wakeup_module.set_publisher(publish)
    try:
        response = app.test_client().post("/as2/as2in", data=message.content,
                                          headers=dict(message.headers))
        assert response.status_code == 200 and b"processed" in response.data
        assert published == []  # the partner has its MDN before the broker is asked
        response.close()
    finally:
        wakeup_module.set_publisher(previous)
    assert published == [[("queued", "sink")]]


def test_the_parse_flattens_no_mime_tree_for_debug_lines_unless_debug_is_on(as2, monkeypatch):
    as2.choose(sign=True, encrypt=True)
    flattened = []
    real = lib._real_mime_to_bytes
    monkeypatch.setattr(lib, "_real_mime_to_bytes",
                        lambda msg, *a, **k: flattened.append(msg) or real(msg, *a, **k))
    assert send_signed(as2)["mdn_status"] == "processed"
    # none: the signed MDN returned is put together from the bytes signed and the
    # signature (lib.mdn_content); pyas2lib's debug lines would add 4
    assert flattened == []
    level = lib._as2.logger.level
    lib._as2.logger.setLevel(logging.DEBUG)
    try:
        assert send_signed(as2)["mdn_status"] == "processed"
    finally:
        lib._as2.logger.setLevel(level)
    assert len(flattened) == 4
    assert [m.status for m in as2.messages()] == ["received", "received"]


@PATHS
def test_partner_quirks_micalg_dash_and_binary_canonicalisation_and_no_chunking(as2):
    as2.choose(sign=True, encrypt=False, mdn_mode="sync", mdn_signed=True, chunked=False,
               canonicalize_as_binary=True)  # the partner signs text: the other form works
    result = as2.partner.send(as2.url, sign=True, mdn_mode="sync", mdn_signed=True,
                              micalg_dash=True)
    assert result["mdn_status"] == "processed", result
    as2.partner.configure(refuse_chunked=True, micalg_dash=True)
    try:
        message = as2.outbound()
        as2.drain()
        assert as2.delivery(message.id).state == "delivered", as2.delivery(
            message.id).last_result
    finally:
        as2.partner.configure(refuse_chunked=False, micalg_dash=False)


def test_async_mdn_without_original_recipient_settles(as2):
    as2.choose(sign=True, encrypt=True, mdn_mode="async", mdn_signed=False)
    as2.partner.configure(async_no_original_recipient=True)
    try:
        message = as2.outbound()
        as2.drain()
        assert wait_for(lambda: as2.delivery(message.id).state == "delivered")
    finally:
        as2.partner.configure(async_no_original_recipient=False)


def post(as2, body: bytes, **headers) -> requests.Response:
    base = {"AS2-From": "ACME", "AS2-To": "HUB", "Message-ID": "<bad-1@acme>",
            "AS2-Version": "1.2", "Content-Type": "application/pkcs7-mime; "
            "smime-type=enveloped-data", "Disposition-Notification-To": "x@acme"}
    return requests.post(as2.url, data=body, headers={**base, **headers}, timeout=30)


@PATHS
@pytest.mark.parametrize("problem", ["malformed", "truncated", "unknown_to", "unknown_from",
                                     "oversize", "wrong_certificate"])
def test_bad_input_is_refused_with_a_reason_never_500(as2, certs, problem):
    as2.choose(sign=True, encrypt=True)
    if problem == "wrong_certificate":
        profiles.save_profile(as2.session, "partner", "acme",
                              {"certificate": {"pem": certs["other"][0]}})
        as2.session.commit()
        answer = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync")
        assert answer["http_status"] == 200 and answer["mdn_status"] != "processed"
        reason = answer["mdn_detail"]
    else:
        body = {"malformed": b"\x00\xff not mime at all",
                "truncated": b"0\x82\x05\x00\x06\x09*\x86H\x86\xf7\r\x01\x07\x03",
                "oversize": b"x" * ((1 << 20) + 10)}.get(problem, b"hello")
        extra = {"unknown_to": {"AS2-To": "NOBODY"},
                 "unknown_from": {"AS2-From": "STRANGER"}}.get(problem, {})
        answer = post(as2, body, **extra)
        assert answer.status_code in (200, 400, 403, 413), answer.text
        reason = answer.text
        if answer.headers.get("Content-Type", "").startswith("multipart"):
            assert b"processed/Error" in answer.content or b"failed" in answer.content
    [message] = as2.messages()
    assert message.status == "refused"
    assert as2.lines(message.id, "refused"), reason
    assert not as2.session.scalars(select(Delivery)).all()
    if problem != "oversize":
        assert "raw" in as2.stages(message.id)  # what came is kept


SIGNED_MDN = {"Disposition-Notification-Options": "signed-receipt-protocol=optional, "
              "pkcs7-signature; signed-receipt-micalg=optional, sha256"}


@pytest.mark.parametrize("mdn", ["none", "unsigned", "signed"])
@pytest.mark.parametrize("problem", ["unknown_to", "unknown_from"])
def test_an_unknown_as2_id_is_refused_as_unknown_whatever_mdn_was_asked(as2, problem, mdn):
    """The reason names the unknown AS2 ID (a partner unknown to us asking for a signed
    MDN once got "malformed" from pyas2lib failing to sign for nobody); the negative
    MDN, when asked for, is not signed for an unknown partner."""
    as2.choose(sign=True, encrypt=True)
    headers = {"unknown_to": {"AS2-To": "NOBODY"},
               "unknown_from": {"AS2-From": "STRANGER"}}[problem]
    if mdn == "signed":
        headers.update(SIGNED_MDN)
    if mdn == "none":
        headers["Disposition-Notification-To"] = ""
    answer = post(as2, b"hello", **headers)
    [message] = as2.messages()
    [refused] = as2.lines(message.id, "refused")
    unknown = "NOBODY" if problem == "unknown_to" else "STRANGER"
    assert "unknown" in refused and unknown in refused and "malformed" not in refused, refused
    assert message.status == "refused" and "raw" in as2.stages(message.id)
    if mdn == "none":
        assert answer.status_code == 403 and unknown in answer.text, answer.text
    else:
        assert answer.status_code == 200, answer.text
        assert b"processed/Error" in answer.content and unknown.encode() in answer.content
    if problem == "unknown_from":
        assert answer.headers["Content-Type"].split(";")[0] != "multipart/signed"


@pytest.mark.parametrize("mdn", ["none", "sync", "async"])
@pytest.mark.parametrize("missing", ["AS2-From", "AS2-To"])
def test_no_as2_from_or_to_is_refused_with_the_reason_whatever_mdn_was_asked(
        as2, caplog, missing, mdn):
    """No MDN can be addressed without both AS2 names (it goes from the AS2-To to the
    AS2-From): the answer is a 400 with the reason, recorded, never a 503 that the
    partner would retry forever."""
    caplog.set_level(logging.INFO)
    headers = {missing: None}
    if mdn == "none":
        headers["Disposition-Notification-To"] = ""
    if mdn == "async":
        headers["Receipt-Delivery-Option"] = "http://127.0.0.1:9/mdn"

    answer = post(as2, b"hello", **headers)

    assert answer.status_code == 400, answer.text
    assert f"no {missing} header" in answer.text
    assert ("no MDN" in answer.text) is (mdn != "none")
    [message] = as2.messages()
    assert message.status == "refused" and "raw" in as2.stages(message.id)
    [refused] = as2.lines(message.id, "refused")
    assert f"not an AS2 message: no {missing} header" in refused
    logged = [r for r in caplog.records if r.name == "plugins.as2.receiver"]
    assert any(f"no {missing} header" in r.getMessage() for r in logged), logged
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_signature_verified_on_the_second_canonicalisation_logs_no_error(
        as2, certs, tmp_path, caplog):
    """``openssl cms -binary`` signs bare line feeds as they are, and its output is
    posted as it is; the partner's profile canonicalises as text, so the first check
    fails and the second (binary) verifies: an expected fallback, logged at debug, not
    an ERROR with a traceback."""
    caplog.set_level(logging.DEBUG)
    as2.choose(sign=True, encrypt=True)
    content = DATA.replace(b"~", b"~\n")

    answer, _files, _entity = openssl_client(as2, certs, tmp_path, content, crlf=False)

    assert answer.status_code == 200 and b"processed/" not in answer.content
    [message] = as2.messages()
    assert message.status != "refused" and as2.stages(message.id)["unpacked"] == content
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    fallback = [r for r in caplog.records if "signature verified with binary" in
                r.getMessage()]
    assert fallback and fallback[0].levelno == logging.DEBUG
    held = [r for r in caplog.records if r.name == "pyas2lib"
            and "Failed to parse" in r.getMessage()]
    assert held and all(r.levelno == logging.DEBUG for r in held)


def test_receipt_timeout_fails_the_delivery_and_a_late_mdn_is_unattributable(as2):
    as2.choose(sign=True, encrypt=True, mdn_mode="async", mdn_signed=True,
               receipt_timeout=3600)
    as2.partner.configure(hold_async=True)
    message = as2.outbound()
    start = utcnow()
    as2.drain(clock=lambda: start)
    assert as2.delivery(message.id).state == "awaiting_receipt"
    fail_overdue_receipts(as2.session, start + timedelta(hours=1, seconds=1), 100)
    as2.session.commit()
    delivery = as2.delivery(message.id)
    assert delivery.state == "failed" and delivery.last_result == "no receipt within 1h"
    late = as2.partner.release_async()
    assert late == 1
    assert wait_for(lambda: as2.lines(message.id, "mdn_refused"))
    assert as2.delivery(message.id).state == "failed"
    as2.partner.configure(hold_async=False)


def test_profile_api_hides_keys_and_certificate_expiry_raises_an_alert(as2, api, certs):
    got = api.get("/api/v1/organizations/mycompany/profiles/as2").get_json()
    assert got["as2_id"] == "HUB" and got["certificates"][0]["has_private_key"]
    assert "PRIVATE" not in json.dumps(got)
    soon = make_pair("soon.example", days=10)
    answer = api.put("/api/v1/partners/acme/profiles/as2",
                     json={"certificate": {"pem": soon[0]}, "mdn_mode": "async"})
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["certificates"][0]["days_left"] in (9, 10)
    bad = api.put("/api/v1/partners/acme/profiles/as2", json={"mdn_mode": "sometimes"})
    assert bad.status_code == 400
    from b2bhub.models import Alert
    assert check_certificates(as2.session, as2.hub.registry, utcnow()) == 1
    as2.session.commit()
    [alert] = as2.session.scalars(select(Alert).where(Alert.kind == "certificate_expiring"))
    assert "acme" in alert.text


def openssl(*args) -> bytes:
    return subprocess.run(["openssl", *args], check=True, capture_output=True).stdout


def openssl_client(as2, certs, tmp_path, content: bytes = DATA,
                   message_id: str = "openssl-1@acme.example", crlf: bool = True):
    """A client made of ``openssl cms`` and requests only: signs (``-binary``: the bytes
    as they are) and encrypts ``content`` and posts it asking for a signed sync MDN;
    ``crlf``: with the lines of openssl's S/MIME output ended CRLF (else as openssl
    wrote them). The answer, the certificate and key files, and the signed entity's
    file."""
    files = {}
    for name, text in (("acme.pem", certs["acme"][0]), ("acme.key", certs["acme"][1]),
                       ("hub.pem", certs["hub"][0])):
        files[name] = tmp_path / name
        files[name].write_text(text)
    entity = tmp_path / "entity"
    entity.write_bytes(b"Content-Type: application/edi-x12\r\n\r\n" + content)
    signed = openssl("cms", "-sign", "-in", str(entity), "-signer", str(files["acme.pem"]),
                     "-inkey", str(files["acme.key"]), "-md", "sha256", "-binary",
                     "-outform", "SMIME")
    if crlf:
        signed = signed.replace(b"\n", b"\r\n").replace(b"\r\r\n", b"\r\n")
    (tmp_path / "signed").write_bytes(signed)
    encrypted = openssl("cms", "-encrypt", "-in", str(tmp_path / "signed"), "-binary",
                        "-aes256", "-outform", "DER", str(files["hub.pem"]))
    return post_envelope(as2, encrypted, message_id), files, entity


def post_envelope(as2, encrypted: bytes, message_id: str) -> requests.Response:
    """Post an EnvelopedData from ACME, asking for a signed sync MDN."""
    return requests.post(as2.url, data=encrypted, timeout=30, headers={
        "AS2-From": "ACME", "AS2-To": "HUB", "AS2-Version": "1.2",
        "Message-ID": f"<{message_id}>",
        "Content-Type": 'application/pkcs7-mime; smime-type=enveloped-data; name="smime.p7m"',
        "Disposition-Notification-To": "edi@acme.example",
        "Disposition-Notification-Options": "signed-receipt-protocol=required, "
        "pkcs7-signature; signed-receipt-micalg=required, sha256"})


@PATHS
def test_openssl_cms_client_signed_encrypted_and_the_signed_mdn_verifies(as2, certs,
                                                                         tmp_path):
    """A client made of ``openssl cms`` and requests only: the hub decrypts and verifies
    its message, and its signed MDN verifies with ``openssl cms -verify``, carrying the
    MIC openssl computes over the signed entity."""
    as2.choose(sign=True, encrypt=True)
    answer, files, entity = openssl_client(as2, certs, tmp_path)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("multipart/signed")
    mdn = tmp_path / "mdn"
    mdn.write_bytes(f"Content-Type: {answer.headers['Content-Type']}\r\n\r\n".encode()
                    + answer.content)
    report = openssl("cms", "-verify", "-in", str(mdn), "-inform", "SMIME", "-noverify",
                     "-certfile", str(files["hub.pem"]))
    assert b"processed" in report and b"processed/" not in report
    digest = base64.b64encode(openssl("dgst", "-sha256", "-binary", str(entity))).decode()
    assert f"Received-content-MIC: {digest}, sha256".lower() in report.decode().lower()
    [message] = as2.messages()
    assert as2.stages(message.id)["unpacked"] == DATA


def test_fixtures_load_as2_profiles(app, session, certs):
    from b2bhub.services.fixtures import load_fixtures
    from plugins.as2.plugin import As2Sender
    data = {"organizations": [{"name": "mycompany"}], "partners": [{"name": "acme"}],
            "profiles": [
                {"party": "mycompany", "protocol": "as2", "as2_id": "HUB",
                 "certificate": {"pem": certs["hub"][0] + certs["hub"][1]}},
                {"party": "acme", "as2_id": "ACME", "url": "https://acme.example/as2",
                 "mdn_mode": "async", "certificate": {"pem": certs["acme"][0]}}]}
    from b2bhub.plugin.registry import PluginRegistry
    registry = PluginRegistry()
    registry.register(As2Sender)
    counts = load_fixtures(session, data, registry=registry)
    session.commit()
    assert counts["profiles"] == 2
    assert profiles.by_party(session, "acme").get("mdn_mode") == "async"
    assert profiles.by_party(session, "mycompany").key_pem.startswith("-----BEGIN PRIVATE")


def test_send_again_repeats_the_same_as2_message_id_and_a_5xx_is_retried(as2, partner):
    from b2bhub.engine.operator import send_again
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True)
    seen = len(as2.partner.received())
    message = as2.outbound()
    as2.drain()
    delivery = as2.delivery(message.id)
    assert delivery.state == "delivered"
    send_again(as2.session, delivery.id, "alice", utcnow())
    as2.session.commit()
    as2.drain()
    first, again = as2.partner.received()[seen:]
    assert first["message_id"] == again["message_id"]
    assert as2.delivery(message.id).state == "delivered"
    as2.choose(url=as2.partner.url + "/busy")  # 503: retried later
    busy = as2.outbound()
    as2.drain()
    assert as2.delivery(busy.id).state == "retrying"
    assert "HTTP 503" in as2.delivery(busy.id).last_result
    as2.choose(url=as2.served + "/as2/missing")  # 404: not retried, failed
    gone = as2.outbound()
    as2.drain()
    assert as2.delivery(gone.id).state == "failed"
    assert "HTTP 404" in as2.delivery(gone.id).last_result


def test_an_owed_async_mdn_is_sent_by_a_worker_the_receipt_woke(as2, procs):
    """No beat here: the receipt itself asks a worker for the plugin job that sends
    owed MDNs (``as2_send_mdns``), which the worker finds through its entry points."""
    procs.worker()
    before = len(as2.partner.mdns())
    result = as2.partner.send(as2.url, sign=True, encrypt=True, compress=False,
                              mdn_mode="async", mdn_signed=True, filename="po.edi")
    assert result["http_status"] == 200, result
    mdns = wait_for(lambda: as2.partner.mdns()[before:], timeout=60)
    assert [m["status"] for m in mdns] == ["processed"], procs.logs()
    [message] = as2.messages()
    # the worker records the sending once the partner answered
    assert wait_for(lambda: as2.session.rollback() or as2.lines(message.id, "mdn_sent"))


@PATHS
def test_a_payload_store_that_cannot_write_is_a_503_that_names_why(as2, app, tmp_path):
    """Disk full, read-only or gone: the partner is told the hub could not store the
    message and why (and retries); nothing is taken, and it goes through once the store
    can write again."""
    from b2bhub.payloads.store import PayloadStore
    good = app.extensions["b2bhub.store"]
    blocked = tmp_path / "a-file-where-the-store-should-be"
    blocked.write_text("not a directory")
    app.extensions["b2bhub.store"] = PayloadStore(str(blocked / "payloads"))
    try:
        answer = send_signed(as2)
    finally:
        app.extensions["b2bhub.store"] = good
    assert answer["http_status"] == 503
    assert "could not store the message (Not a directory)" in answer["text"]
    assert "nothing was taken" in answer["text"] and as2.messages() == []
    assert send_signed(as2)["http_status"] == 200
    assert [m.status for m in as2.messages()] == ["received"]


@pytest.mark.parametrize("headers", [
    [("AS2-From", "ACME"), ("AS2-To", "HUB"), ("Message-ID", "<a@b>")],
    [("AS2-From", "  \tACME  "), ("as2-from", "OTHER"), ("X-Empty", "")],
    [("AS2-From", "Ünï"), ("AS2-To", "HUB")],
    [("AS2-From", "A\x0bB"), ("AS2-To", "HUB")],
    [("Bad Name", "x"), ("AS2-To", "HUB")],
    [("AS2-From", "A\r\nAS2-To: EVIL")],
])
def test_the_request_headers_read_as_the_email_parser_reads_them(headers):
    """The receiver reads the headers from the HTTP pairs; whatever they hold, it finds
    what parsing their header block would find (blanks, repeats, non-ASCII, breaks)."""
    block = lib.header_block(headers)
    assert lib.headers_of(headers, block) == lib.read_headers(block)
