"""OpenPGP both ways against the ``gpg`` command line, in one process with the engine:
a file the partner encrypted and signed with ``gpg`` arrives through a ``file_poller``
as its plain ``unpacked`` stage (the EDI inspection reading that); a message written by
a ``file_writer`` with encrypt and sign on is decrypted and its signature verified by
``gpg --decrypt``; every way a received file can be wrong is refused with its reason,
its received bytes kept; a target without the keys fails with the reason, not retried.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from b2bhub.domain.states import DeliveryState, MessageStatus
from b2bhub.engine import operator
from b2bhub.engine.runner import TargetRunner
from b2bhub.engine.scans import SourceRunner
from b2bhub.models import Delivery, HistoryLine, Message, MessageAttribute, Payload
from b2bhub.runtime.hub import new_session
from b2bhub.services.openpgp_profiles import OPENPGP_PROFILES
from plugins.file_poller import FilePoller
from plugins.file_writer import FileWriter
from tests.openpgp_kit import ORG_PASSPHRASE, keys_in

X12 = (Path(__file__).parent / "samples" / "x12-850-purchase-order.edi").read_bytes()
T0 = datetime(2030, 1, 1, 12, 0, 0)


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(scope="module")
def keys(tmp_path_factory, openpgp_keys):
    yield from keys_in(tmp_path_factory.mktemp("gpg"), openpgp_keys)


@pytest.fixture
def registry(registry):
    registry.register(FilePoller)
    registry.register(FileWriter)
    return registry


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def parties(hub, session, keys):
    """mycompany with its key pair, acme with its public key."""
    hub.parties(organizations=("mycompany",), partners=("acme",))
    OPENPGP_PROFILES.save(session, "organization", "mycompany", {
        "private_key": keys.org.private, "passphrase": ORG_PASSPHRASE})
    OPENPGP_PROFILES.save(session, "partner", "acme", {"public_key": keys.partner.public})
    session.commit()


def inbound(hub, base: Path, record_dir: Path, **openpgp) -> None:
    """A poller taking the files acme left in its folder (``{to}/{filename}``, from
    mycompany: a file poller's messages go to a partner; the key pair used is still
    the organization's, the signature checked the partner's), routed to a recorder."""
    hub.instance("poller", "file_poller", config={
        "base_directory": str(base), "path_pattern": "{to}/{filename}",
        **openpgp})
    hub.instance("rec", "recorder", config={"record_dir": str(record_dir)})
    hub.route("poller", "*", "*", "rec")


def receive(registry, hub, clock, base: Path, name: str, body: bytes) -> Message:
    path = base / "acme" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    runner = SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock)
    for _ in range(2):  # a file is taken once two scans agree on it
        runner.scan("poller")
        clock.advance(10)
    assert not path.exists(), "the file was not taken"
    session = hub.session
    session.expire_all()
    return session.scalars(select(Message).order_by(Message.id.desc())).first()


def stages(session, message_id: int) -> dict[str, str]:
    return dict(session.execute(select(Payload.stage, Payload.digest).where(
        Payload.message_id == message_id)).all())


def lines(session, message_id: int, type_: str) -> list[str]:
    return list(session.scalars(select(HistoryLine.text).where(
        HistoryLine.message_id == message_id, HistoryLine.type == type_)))


def keyrings(where: str) -> tuple[set[str], list[str]]:
    """The hub's keyring directories in ``where`` and the gpg-agents serving them."""
    found = {name for name in os.listdir(where) if name.startswith("b2bhub-gpg-")}
    agents = subprocess.run(["pgrep", "-af", "gpg-agent"], capture_output=True, text=True)
    return found, [line for line in agents.stdout.splitlines()
                   if f"{where}/b2bhub-gpg-" in line]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- receiving ------------------------------------------------------------------------

def test_a_file_encrypted_and_signed_by_gpg_arrives_as_plain_unpacked(
        registry, hub, clock, session, parties, keys, tmp_path, record_dir):
    base = tmp_path / "in"
    inbound(hub, base, record_dir, openpgp_decrypt=True, openpgp_verify=True)
    wire = keys.partner.gpg("--encrypt", "--sign", "--recipient", keys.org.fingerprint,
                            "--local-user", keys.partner.fingerprint, data=X12).stdout
    message = receive(registry, hub, clock, base, "po.edi.gpg", wire)

    assert message.status != MessageStatus.REFUSED, message.status_text
    found = stages(session, message.id)
    assert found["raw"] == sha(wire) and found["unpacked"] == sha(X12)
    with hub.store.open(found["unpacked"]) as stream:
        assert stream.read() == X12
    assert lines(session, message.id, "openpgp") == [
        "OpenPGP: decrypted and signature of acme verified"]
    # the EDI inspection read the plain document, not the encrypted bytes
    attributes = dict(session.execute(select(MessageAttribute.name, MessageAttribute.value)
                                      .where(MessageAttribute.message_id == message.id)).all())
    assert attributes.get("document_type") == "850"
    # and the target got the plain document
    delivery = session.scalars(select(Delivery).where(Delivery.message_id == message.id)).one()
    TargetRunner(new_session, registry, hub.store, "w", clock=clock).drain("rec", budget=30)
    session.expire_all()
    assert session.get(Delivery, delivery.id).state == DeliveryState.DELIVERED


def _tampered_signed(keys) -> bytes:
    """A message signed (not encrypted) by the partner, one byte of its text changed."""
    signed = keys.partner.gpg("--sign", "--compress-algo", "none", "--local-user",
                              keys.partner.fingerprint, data=b"ISA*00*original~").stdout
    assert b"ISA*00*original~" in signed
    return signed.replace(b"ISA*00*original~", b"ISA*00*origina1~")


@pytest.mark.parametrize("case, settings, reason", [
    ("bad signature", {"openpgp_verify": True},
     "OpenPGP: bad signature (key {partner_id}): the content is not what was signed"),
    ("unsigned", {"openpgp_decrypt": True, "openpgp_verify": True},
     "OpenPGP: not signed, and this source's openpgp_verify requires a signature by the "
     "sender's key {partner}"),
    ("signed by another key", {"openpgp_decrypt": True, "openpgp_verify": True},
     "OpenPGP: signed by key {stranger_id}, which is not the sender's key {partner}"),
    ("encrypted to another key", {"openpgp_decrypt": True, "openpgp_verify": True},
     "OpenPGP: encrypted to key {stranger_sub}, which is not ours (ours is {org})"),
    ("not encrypted", {"openpgp_decrypt": True},
     "OpenPGP: the message is not encrypted, and this source's openpgp_decrypt "
     "requires it"),
    ("not openpgp", {"openpgp_decrypt": True}, "OpenPGP: not an OpenPGP message"),
])
def test_a_wrong_file_is_refused_with_its_reason_and_kept_as_raw(
        registry, hub, clock, session, parties, keys, tmp_path, record_dir, case,
        settings, reason):
    base = tmp_path / "in"
    inbound(hub, base, record_dir, **settings)
    partner, stranger = keys.partner, keys.stranger
    stranger.trust(keys.org)
    partner.trust(stranger)
    wire = {
        "bad signature": lambda: _tampered_signed(keys),
        "unsigned": lambda: partner.gpg("--encrypt", "--recipient", keys.org.fingerprint,
                                        data=X12).stdout,
        "signed by another key": lambda: stranger.gpg(
            "--encrypt", "--sign", "--recipient", keys.org.fingerprint, data=X12).stdout,
        "encrypted to another key": lambda: partner.gpg(
            "--encrypt", "--sign", "--recipient", stranger.fingerprint, data=X12).stdout,
        "not encrypted": lambda: partner.gpg("--sign", data=X12).stdout,
        "not openpgp": lambda: X12,
    }[case]()
    message = receive(registry, hub, clock, base, "po.edi.gpg", wire)

    stranger_sub = next(line.split(":")[4] for line in stranger.gpg(
        "--list-keys", "--with-colons").stdout.decode().splitlines()
        if line.startswith("sub:"))
    expected = reason.format(partner=partner.fingerprint, partner_id=partner.fingerprint[-16:],
                             stranger_id=stranger.fingerprint[-16:],
                             stranger_sub=stranger_sub, org=keys.org.fingerprint)
    assert message.status == MessageStatus.REFUSED
    assert message.status_text == expected
    assert lines(session, message.id, "refused") == [expected]
    assert stages(session, message.id) == {"raw": sha(wire)}  # nothing lost, nothing else
    assert session.scalars(select(Delivery).where(Delivery.message_id == message.id)).all() == []


def test_a_source_without_our_key_pair_refuses_saying_which_is_missing(
        registry, hub, clock, session, keys, tmp_path, record_dir):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    base = tmp_path / "in"
    inbound(hub, base, record_dir, openpgp_decrypt=True)
    wire = keys.partner.gpg("--encrypt", "--recipient", keys.org.fingerprint, data=X12).stdout
    message = receive(registry, hub, clock, base, "po.gpg", wire)
    assert message.status == MessageStatus.REFUSED
    assert message.status_text == ("OpenPGP: mycompany has no key pair to decrypt with "
                                   "(an openpgp profile with its private key)")


# --- sending --------------------------------------------------------------------------

def outbound(hub, base: Path, out: Path, **openpgp) -> None:
    """A poller taking mycompany's files for acme, routed to a file_writer."""
    hub.instance("poller", "file_poller", config={
        "base_directory": str(base), "path_pattern": "{to}/{filename}",
        "from": "mycompany"})
    hub.instance("writer", "file_writer", config={
        "base_directory": str(out), "filename_pattern": "{original_filename}.pgp",
        "overwrite": True, **openpgp})
    hub.route("poller", "*", "*", "writer")


def send(registry, hub, clock, base: Path, body: bytes) -> Message:
    path = base / "acme" / "po.edi"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    runner = SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock)
    for _ in range(2):
        runner.scan("poller")
        clock.advance(10)
    TargetRunner(new_session, registry, hub.store, "w", clock=clock).drain("writer",
                                                                          budget=30)
    hub.session.expire_all()
    return hub.session.scalars(select(Message).order_by(Message.id.desc())).first()


def test_a_file_written_encrypted_and_signed_is_read_by_gpg(
        registry, hub, clock, session, parties, keys, tmp_path, monkeypatch):
    base, out = tmp_path / "in", tmp_path / "out"
    outbound(hub, base, out, openpgp_encrypt=True, openpgp_sign=True)
    # the operation's keyrings are made in a temporary directory of this test's own, so
    # that another test's keyring at the same moment (another process of the suite) is
    # not taken for one left behind; short, as gpg-agent's socket path must be
    own = tempfile.mkdtemp(prefix="pgp-")
    monkeypatch.setattr(tempfile, "tempdir", own)
    try:
        message = send(registry, hub, clock, base, X12)
        # the keyring made for the operation (our secret key in it) is gone, with its agent
        assert keyrings(own) == (set(), [])
    finally:
        shutil.rmtree(own, ignore_errors=True)

    assert message.status == MessageStatus.DELIVERED, message.status_text
    written = (out / "po.edi.pgp").read_bytes()
    assert X12[:20] not in written
    found = stages(session, message.id)
    assert found["sent"] == sha(written) and found["unpacked"] == sha(X12)
    opened = keys.partner.gpg("--status-fd", "2", "--decrypt", data=written)
    assert opened.stdout == X12
    status = opened.stderr.decode()
    assert "[GNUPG:] DECRYPTION_OKAY" in status
    assert f"[GNUPG:] VALIDSIG {keys.org.fingerprint[-40:]}" in status
    assert "[GNUPG:] GOODSIG" in status
    [line] = lines(session, message.id, "openpgp")
    assert line == (f"OpenPGP for writer: encrypted to acme's key {keys.partner.fingerprint} "
                    f"and signed with mycompany's key {keys.org.fingerprint}; stored as "
                    "the sent stage")

    # Send again sends the same sent stage again: encrypted once per message and target
    delivery = session.scalars(select(Delivery).where(Delivery.message_id == message.id)).one()
    operator.send_again(session, delivery.id, "olivia", clock())
    session.commit()
    (out / "po.edi.pgp").unlink()
    TargetRunner(new_session, registry, hub.store, "w", clock=clock).drain("writer",
                                                                          budget=30)
    session.expire_all()
    assert session.get(Delivery, delivery.id).state == DeliveryState.DELIVERED
    assert session.get(Delivery, delivery.id).attempt == 2
    assert (out / "po.edi.pgp").read_bytes() == written
    assert len(lines(session, message.id, "openpgp")) == 1


def test_a_file_only_signed_is_verified_by_gpg(registry, hub, clock, session, parties,
                                               keys, tmp_path):
    base, out = tmp_path / "in", tmp_path / "out"
    outbound(hub, base, out, openpgp_sign=True)
    message = send(registry, hub, clock, base, X12)
    assert message.status == MessageStatus.DELIVERED, message.status_text
    opened = keys.partner.gpg("--status-fd", "2", "--decrypt",
                              data=(out / "po.edi.pgp").read_bytes())
    assert opened.stdout == X12
    assert "DECRYPTION_OKAY" not in opened.stderr.decode()
    assert f"[GNUPG:] VALIDSIG {keys.org.fingerprint}" in opened.stderr.decode()


def test_a_target_without_the_partners_key_fails_with_the_reason_once(
        registry, hub, clock, session, keys, tmp_path):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    base, out = tmp_path / "in", tmp_path / "out"
    outbound(hub, base, out, openpgp_encrypt=True)
    message = send(registry, hub, clock, base, X12)
    delivery = session.scalars(select(Delivery).where(Delivery.message_id == message.id)).one()
    assert delivery.state == DeliveryState.FAILED and delivery.attempt == 1
    assert message.status == MessageStatus.ERROR
    reason = ("OpenPGP: acme has no public key to encrypt to (an openpgp profile); add "
              "it, then redeliver")
    said = list(session.execute(select(HistoryLine.type, HistoryLine.text).where(
        HistoryLine.message_id == message.id)).all())
    assert any(reason in text for _type, text in said), said
    assert not out.exists() or list(out.rglob("*")) == []


# --- a source that stores its messages itself: the HTTP receiver -----------------------

@pytest.mark.parametrize("size", ["preread", "streamed"])
def test_an_http_receiver_decrypts_and_verifies_and_refuses_a_stranger(
        served, registry, hub, session, parties, keys, record_dir, size):
    import requests

    from plugins.http_receiver import HttpReceiver, create_token

    registry.register(HttpReceiver)
    hub.instance("inbox", "http_receiver", config={
        "from_party": "acme", "to_party": "mycompany", "openpgp_decrypt": True,
        "openpgp_verify": True})
    hub.instance("rec", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "rec")
    token = create_token(session, "inbox", "client", "tests")
    session.commit()
    # past the preread size a body streams into the store before it is decrypted
    document = X12 if size == "preread" else X12 + b"\n" * (300 * 1024)
    wire = keys.partner.gpg("--encrypt", "--sign", "--compress-algo", "none",
                            "--recipient", keys.org.fingerprint, data=document).stdout
    answer = requests.post(f"{served}/in/inbox", data=wire, timeout=30,
                           headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 202, answer.text
    session.expire_all()
    message = session.get(Message, answer.json()["message_id"])
    assert stages(session, message.id) == {"raw": sha(wire), "unpacked": sha(document)}
    attributes = dict(session.execute(select(MessageAttribute.name, MessageAttribute.value)
                                      .where(MessageAttribute.message_id == message.id)).all())
    assert attributes.get("document_type") == "850"
    assert session.scalars(select(Delivery).where(Delivery.message_id == message.id)).all()

    keys.stranger.trust(keys.org)
    forged = keys.stranger.gpg("--encrypt", "--sign", "--recipient", keys.org.fingerprint,
                               data=document).stdout
    answer = requests.post(f"{served}/in/inbox", data=forged, timeout=30,
                           headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 422, answer.text
    reason = (f"OpenPGP: signed by key {keys.stranger.fingerprint[-16:]}, which is not the "
              f"sender's key {keys.partner.fingerprint}")
    assert answer.json()["text"] == reason
    session.expire_all()
    refused = session.get(Message, answer.json()["message_id"])
    assert (refused.status, refused.status_text) == (MessageStatus.REFUSED, reason)
    assert stages(session, refused.id) == {"raw": sha(forged)}


def test_a_scan_keeps_its_lease_from_its_own_thread_while_gpg_decrypts(
        monkeypatch, hub, session, parties, keys):
    import threading

    from b2bhub.engine import openpgp_stages
    from b2bhub.engine.intake import Fence, SourceIntake

    monkeypatch.setattr(openpgp_stages, "KEEP_ALIVE_EVERY", 0.01)
    renewals: list[int] = []

    class Lease(Fence):
        def keep_alive(self) -> None:
            renewals.append(threading.get_ident())

    intake = SourceIntake(session, hub.store, "poller", fence=Lease(),
                          config={"openpgp_decrypt": True, "openpgp_verify": True})
    document = X12 * 20_000  # about 10 MB: gpg takes far longer than 10 ms
    wire = keys.partner.gpg("--encrypt", "--sign", "--recipient", keys.org.fingerprint,
                            data=document).stdout
    got = intake.unpack("mycompany", "acme", hub.store.put(wire))
    assert got.stages["unpacked"] == (sha(document), len(document)), got.lines
    # renewed while gpg worked, on the scan's thread (its session is not shared)
    assert renewals and set(renewals) == {threading.get_ident()}


def test_a_partner_key_that_expired_since_it_was_saved_fails_the_delivery_once(
        registry, hub, clock, session, parties, keys, tmp_path):
    from b2bhub.models import Party, ProtocolProfile
    # time passed: the key in acme's profile is the expired one now
    profile = session.scalars(select(ProtocolProfile).join(Party).where(
        Party.name == "acme", ProtocolProfile.protocol == "openpgp")).one()
    shown = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons"],
                           input=keys.expired_public, capture_output=True, text=True).stdout
    fingerprint = next(line.split(":")[9] for line in shown.splitlines()
                       if line.startswith("fpr:"))
    profile.settings = {**profile.settings, "public_key": keys.expired_public,
                        "fingerprint": fingerprint}
    session.commit()
    base, out = tmp_path / "in", tmp_path / "out"
    outbound(hub, base, out, openpgp_encrypt=True)
    message = send(registry, hub, clock, base, X12)
    delivery = session.scalars(select(Delivery).where(Delivery.message_id == message.id)).one()
    assert (delivery.state, delivery.attempt) == (DeliveryState.FAILED, 1)
    said = [text for (text,) in session.execute(select(HistoryLine.text).where(
        HistoryLine.message_id == message.id))]
    assert any("OpenPGP: gpg cannot use the recipient's key (expired or revoked since it "
               "was saved?)" in text and "update the profile, then redeliver" in text
               for text in said), said
    assert not out.exists() or list(out.rglob("*")) == []


def test_several_targets_each_send_their_own_sealed_copy_and_keep_it_on_redelivery(
        registry, hub, clock, session, parties, keys, tmp_path):
    """One message, three targets: two encrypt (each its own copy: its own session
    key), one sends the plain document. The message's ``sent`` stage is the last one
    made; each target's copy stays its own, so a redelivery of the first sends the
    bytes it sent before, not the other target's."""
    base, out, out2, plain = (tmp_path / n for n in ("in", "out", "out2", "plain"))
    outbound(hub, base, out, openpgp_encrypt=True, openpgp_sign=True)
    for name, where, openpgp in (("writer2", out2, {"openpgp_encrypt": True}),
                                 ("plainwriter", plain, {})):
        hub.instance(name, "file_writer", config={
            "base_directory": str(where), "filename_pattern": "{original_filename}.pgp",
            "overwrite": True, **openpgp})
        hub.route("poller", "*", "*", name)
    message = send(registry, hub, clock, base, X12)
    for name in ("writer2", "plainwriter"):
        TargetRunner(new_session, registry, hub.store, "w", clock=clock).drain(name,
                                                                              budget=30)
    session.expire_all()
    deliveries = {d.target: d for d in session.scalars(select(Delivery).where(
        Delivery.message_id == message.id))}
    assert {t: d.state for t, d in deliveries.items()} == {
        t: DeliveryState.DELIVERED for t in ("writer", "writer2", "plainwriter")}

    first, second = (out / "po.edi.pgp").read_bytes(), (out2 / "po.edi.pgp").read_bytes()
    assert first != second and X12[:20] not in first + second
    assert keys.partner.gpg("--decrypt", data=first).stdout == X12
    assert keys.partner.gpg("--decrypt", data=second).stdout == X12
    assert (plain / "po.edi.pgp").read_bytes() == X12
    made = lines(session, message.id, "openpgp")
    assert sorted(line.split(":")[0] for line in made) == ["OpenPGP for writer",
                                                           "OpenPGP for writer2"]
    assert stages(session, message.id)["sent"] in (sha(first), sha(second))

    # redeliver the first target after the second pointed the sent stage at its copy
    operator.send_again(session, deliveries["writer"].id, "olivia", clock())
    session.commit()
    (out / "po.edi.pgp").unlink()
    TargetRunner(new_session, registry, hub.store, "w", clock=clock).drain("writer",
                                                                          budget=30)
    session.expire_all()
    assert session.get(Delivery, deliveries["writer"].id).state == DeliveryState.DELIVERED
    assert (out / "po.edi.pgp").read_bytes() == first
    assert len(lines(session, message.id, "openpgp")) == 2  # nothing sealed again


# --- an HTTP collector decrypting what it fetched ---------------------------------------

def test_an_http_collector_decrypts_and_verifies_what_it_fetches(
        registry, hub, clock, session, parties, keys, record_dir):
    """The partner publishes its document encrypted and signed; the collector's
    messages hold it plain in the unpacked stage; a document signed by someone else is
    refused with the reason, and kept as it was fetched."""
    from plugins.http_collector import HttpCollector
    from tests.test_http_collector import Document, serve

    registry.register(HttpCollector)
    doc = Document()
    server = serve(doc)
    try:
        doc.change(keys.partner.gpg("--encrypt", "--sign", "--recipient",
                                    keys.org.fingerprint, "--local-user",
                                    keys.partner.fingerprint, data=X12).stdout)
        hub.instance("collect", "http_collector", config={
            "url": doc.url, "from": "acme", "to": "mycompany", "polling_interval": 10,
            "openpgp_decrypt": True, "openpgp_verify": True})
        hub.instance("rec", "recorder", config={"record_dir": str(record_dir)})
        hub.route("collect", "*", "*", "rec")
        runner = SourceRunner(new_session, registry, hub.store, "proc-a", clock=clock)
        runner.scan("collect")
        clock.advance(10)
        session.expire_all()
        message = session.scalars(select(Message).order_by(Message.id.desc())).first()
        assert message.status != MessageStatus.REFUSED, message.status_text
        found = stages(session, message.id)
        assert found["raw"] == sha(doc.body) and found["unpacked"] == sha(X12)
        assert lines(session, message.id, "openpgp") == [
            "OpenPGP: decrypted and signature of acme verified"]

        keys.stranger.trust(keys.org)
        forged = keys.stranger.gpg("--encrypt", "--sign", "--recipient",
                                   keys.org.fingerprint, "--local-user",
                                   keys.stranger.fingerprint, data=X12).stdout
        doc.change(forged)
        runner.scan("collect")
        session.expire_all()
        refused = session.scalars(select(Message).order_by(Message.id.desc())).first()
        assert refused.id != message.id and refused.status == MessageStatus.REFUSED
        assert refused.status_text.startswith("OpenPGP: signed by key "), \
            refused.status_text
        assert "which is not the sender's key" in refused.status_text
        assert stages(session, refused.id) == {"raw": sha(forged)}
    finally:
        server.shutdown()
