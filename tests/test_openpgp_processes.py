"""OpenPGP with real worker and beat processes, both ways against the ``gpg`` command
line: the partner's encrypted and signed files are taken by a ``file_poller`` (decrypt
and verify on) and written plain; our files go out through a ``file_writer`` (encrypt
and sign on) and the partner's ``gpg --decrypt`` reads them and checks our signature. A
200 MB file goes each way with the worker's peak resident memory bounded, and a file
signed by a stranger is refused with the reason. The instances and the keys come from
``b2bhub fixtures load``."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from sqlalchemy import select

from b2bhub.models import Message, Payload
from tests.openpgp_kit import ORG_PASSPHRASE, keys_in
from tests.procs import wait_until
from tests.test_e2e_files import rows
from tests.test_edi_large_intake import peak_rss

pytestmark = pytest.mark.processes

MB = 1024 * 1024
X12 = (Path(__file__).parent / "samples" / "x12-850-purchase-order.edi").read_bytes()
BIG = 200 * MB
#: how much the worker's peak RSS may rise while it decrypts and encrypts 200 MB
RSS_BOUND = 50 * MB


@pytest.fixture(scope="module")
def keys(tmp_path_factory, openpgp_keys):
    yield from keys_in(tmp_path_factory.mktemp("gpg"), openpgp_keys)


def drop(directory: Path, name: str, body: bytes | Path) -> None:
    """Put a file in place as a partner's upload does: written aside, renamed in."""
    staging = directory.parent / "staging"
    staging.mkdir(exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(body, Path):
        os.rename(body, directory / name)
        return
    (staging / name).write_bytes(body)
    os.rename(staging / name, directory / name)


def sha_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def big_file(path: Path) -> str:
    """200 MB of text such as an interchange's (hex: compressible about 2:1)."""
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for _ in range(BIG // (2 * MB)):
            chunk = os.urandom(MB).hex().encode()
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def complete(path: Path, sha: str) -> bool:
    return path.exists() and path.stat().st_size > 0 and sha_of(path) == sha


def test_both_ways_with_real_processes_and_200_mb_in_bounded_memory(procs, keys, tmp_path):
    received, plain = tmp_path / "in", tmp_path / "plain"
    ours, sealed = tmp_path / "send", tmp_path / "sealed"
    fixtures = {
        "organizations": [{"name": "mycompany"}], "partners": [{"name": "acme"}],
        "profiles": [
            {"party": "mycompany", "protocol": "openpgp", "private_key": keys.org.private,
             "passphrase": ORG_PASSPHRASE},
            {"party": "acme", "protocol": "openpgp", "public_key": keys.partner.public}],
        "plugins": [
            {"name": "receive", "type": "file_poller", "config": {
                "base_directory": str(received), "path_pattern": "{to}/{filename}",
                "polling_interval": 1, "openpgp_decrypt": True, "openpgp_verify": True}},
            {"name": "plain", "type": "file_writer", "config": {
                "base_directory": str(plain), "filename_pattern": "{original_filename}"}},
            {"name": "send", "type": "file_poller", "config": {
                "base_directory": str(ours), "path_pattern": "{to}/{filename}",
                "polling_interval": 1}},
            {"name": "sealed", "type": "file_writer", "config": {
                "base_directory": str(sealed), "filename_pattern": "{original_filename}.pgp",
                "openpgp_encrypt": True, "openpgp_sign": True}}],
        "routes": [{"source": "receive", "target": "plain"},
                   {"source": "send", "target": "sealed"}]}
    (tmp_path / "fixtures.json").write_text(json.dumps(fixtures))
    done = procs.cli("fixtures", "load", str(tmp_path / "fixtures.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    worker = procs.worker()
    procs.beat()

    # small ones first: the worker's peak then includes its imports and usual work
    partner, org = keys.partner, keys.org
    drop(received / "acme", "small.pgp", partner.gpg(
        "--encrypt", "--sign", "--recipient", org.fingerprint, data=X12).stdout)
    drop(ours / "acme", "small.edi", X12)
    wait_until(lambda: (plain / "small.pgp").exists(), 90, "small.pgp decrypted and written")
    assert (plain / "small.pgp").read_bytes() == X12
    wait_until(lambda: (sealed / "small.edi.pgp").exists(), 90, "small.edi sealed")
    opened = partner.gpg("--status-fd", "2", "--decrypt",
                         data=(sealed / "small.edi.pgp").read_bytes())
    assert opened.stdout == X12
    assert f"[GNUPG:] VALIDSIG {org.fingerprint}" in opened.stderr.decode()

    # a file signed by someone else is refused, its bytes kept, nothing written
    keys.stranger.trust(org)
    forged = keys.stranger.gpg("--encrypt", "--sign", "--recipient", org.fingerprint,
                               data=X12).stdout
    drop(received / "acme", "forged.pgp", forged)
    refused = wait_until(lambda: rows(select(Message.status, Message.status_text, Message.id)
                                      .where(Message.original_filename == "forged.pgp")),
                         60, "forged.pgp stored")
    assert refused[0][:2] == ("refused", f"OpenPGP: signed by key "
                              f"{keys.stranger.fingerprint[-16:]}, which is not the "
                              f"sender's key {partner.fingerprint}")
    assert rows(select(Payload.stage, Payload.digest).where(
        Payload.message_id == refused[0][2])) == [("raw", hashlib.sha256(forged).hexdigest())]
    before = peak_rss(worker.pid)

    # 200 MB each way
    source = tmp_path / "big.txt"
    big_sha = big_file(source)
    partner.gpg("--encrypt", "--sign", "--recipient", org.fingerprint, "--output",
                str(tmp_path / "big.pgp"), str(source))
    wire_size = (tmp_path / "big.pgp").stat().st_size
    drop(received / "acme", "big.pgp", tmp_path / "big.pgp")
    drop(ours / "acme", "big.txt", source)
    wait_until(lambda: complete(plain / "big.pgp", big_sha), 600,
               "big.pgp decrypted and written")
    wait_until(lambda: (sealed / "big.txt.pgp").exists(), 600, "big.txt sealed and written")
    after = peak_rss(worker.pid)
    back = partner.gpg("--status-fd", "2", "--output", str(tmp_path / "back.txt"),
                       "--decrypt", str(sealed / "big.txt.pgp"))
    assert f"[GNUPG:] VALIDSIG {org.fingerprint}" in back.stderr.decode()
    assert sha_of(tmp_path / "back.txt") == big_sha
    print(f"worker peak RSS {before / MB:.1f} MB before, {after / MB:.1f} MB after "
          f"decrypting and encrypting {BIG / MB:.0f} MB")
    assert after - before < RSS_BOUND, (
        f"the worker's peak RSS rose by {(after - before) / MB:.1f} MB "
        f"({before / MB:.1f} -> {after / MB:.1f} MB)")
    stages = dict(rows(select(Payload.stage, Payload.size).join(
        Message, Message.id == Payload.message_id).where(
        Message.original_filename == "big.pgp")))
    assert stages == {"raw": wire_size, "unpacked": BIG}
    sent = dict(rows(select(Payload.stage, Payload.digest).join(
        Message, Message.id == Payload.message_id).where(
        Message.original_filename == "big.txt")))
    assert sent["sent"] == sha_of(sealed / "big.txt.pgp")
