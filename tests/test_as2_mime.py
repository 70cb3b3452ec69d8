"""The receiver's MIME reading (plugins/as2/mime.py) gives the email package's own
entities, attribute for attribute, or leaves the input to it: on what pyas2lib sends
(signed, encrypted, compressed, text and binary documents, both line breaks) and on
every irregular shape of a header block or a multipart/signed."""

from __future__ import annotations

import email
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyas2lib import Message, Organization, Partner

from plugins.as2 import lib, mime
from tests.as2kit import make_pair


def _same(ours, theirs, where="the entity") -> None:
    assert type(ours) is type(theirs), where
    mine, other = dict(vars(ours)), dict(vars(theirs))
    payload, expected = mine.pop("_payload"), other.pop("_payload")
    defects = [(type(d), str(d)) for d in mine.pop("defects")]
    assert defects == [(type(d), str(d)) for d in other.pop("defects")], where
    assert mine == other, where  # headers, preamble, epilogue, default type, charset...
    if isinstance(expected, list):
        assert isinstance(payload, list) and len(payload) == len(expected), where
        for i, (part, its) in enumerate(zip(payload, expected, strict=True)):
            _same(part, its, f"{where}, part {i}")
    else:
        assert payload == expected, where


def _read(data: bytes):
    """Ours (None: left to the email package), checked against the email package's."""
    ours = mime.parse(data, lib._Entity)
    if ours is not None:
        _same(ours, email.message_from_bytes(data, _class=lib._Entity))
        assert ours.as_bytes() == email.message_from_bytes(
            data, _class=lib._Entity).as_bytes()
    return ours


@pytest.fixture(scope="module")
def pair():
    hub, acme = make_pair("hub.mime"), make_pair("acme.mime")
    sender = Organization(as2_name="ACME", sign_key=(acme[1] + acme[0]).encode(),
                          decrypt_key=(acme[1] + acme[0]).encode())
    receiver = Organization(as2_name="HUB", sign_key=(hub[1] + hub[0]).encode(),
                            decrypt_key=(hub[1] + hub[0]).encode())
    return sender, receiver, hub[0].encode(), acme[0].encode()


DOCUMENTS = {
    "x12 on one line": b"ISA*00*" + b"0123456789abcdef" * 600,
    "edifact, CRLF lines": b"UNB+UNOA:2+ACME+HUB'\r\n" * 300,
    "lines ending LF": b"line of a flat file\n" * 300,
    "binary": os.urandom(8000),
    "a line like a boundary": b"------=_Part_0\r\n--\r\n" * 10,
}


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("sign,encrypt,compress", [
    (True, True, False), (True, False, False), (False, True, False), (True, True, True)])
def test_what_pyas2lib_sends_is_read_as_the_email_package_reads_it(
        pair, document, sign, encrypt, compress):
    sender, receiver, hub_cert, acme_cert = pair
    to = Partner(as2_name="HUB", verify_cert=hub_cert, encrypt_cert=hub_cert,
                 validate_certs=False, sign=sign, encrypt=encrypt, compress=compress,
                 enc_alg="aes_256_cbc", mdn_mode="SYNC", mdn_digest_alg="sha256")
    message = Message(sender, to)
    message.build(DOCUMENTS[document], filename="doc.edi", content_type="application/edi-x12")
    raw = b"".join(f"{k}: {v}\r\n".encode() for k, v in message.headers.items()) + \
        b"\r\n" + message.content
    seen: list[tuple[bytes, object]] = []
    original = mime.parse

    def recorded(data, factory):
        entity = original(data, factory)
        seen.append((data, entity))
        return entity

    partner = Partner(as2_name="ACME", verify_cert=acme_cert, validate_certs=False,
                      sign=sign, encrypt=encrypt)
    mime.parse = recorded
    try:
        with lib.parsing():
            status, exc, _mdn = Message().parse(
                raw, find_org_cb=lambda _i: receiver, find_partner_cb=lambda _i: partner)
    finally:
        mime.parse = original
    assert status == "processed", exc
    for data, _entity in seen:
        _read(data)  # the same entities as the email package's
    # the message as received is always ours to read; a signed content is where its
    # line breaks are CRLF only (a binary document's or a compressed one's are not: the
    # email package's)
    assert seen[0][1] is not None
    if sign and not compress and document in ("x12 on one line", "edifact, CRLF lines"):
        [(data, signed)] = [(d, e) for d, e in seen if b"multipart/signed" in d[:200]]
        assert signed is not None and signed.get_content_type() == "multipart/signed"


SIGNED = ("Content-Type: multipart/signed; protocol=\"application/pkcs7-signature\"; "
          "micalg=sha-256; boundary=\"b1\"\r\n\r\n")
PART = "Content-Type: application/edi-x12\r\nContent-Transfer-Encoding: binary\r\n\r\n"
SIG = "Content-Type: application/pkcs7-signature\r\n\r\nc2lnbmF0dXJl\r\n"


def _signed(body: str, head: str = SIGNED) -> bytes:
    return (head + body).encode("ascii", "surrogateescape")


PLAIN = f"--b1\r\n{PART}ISA*00*X~\r\n--b1\r\n{SIG}--b1--\r\n"

# (shape, the input, whether it is read here rather than left to the email package)
SHAPES = [
    ("plain", _signed(PLAIN), True),
    ("a preamble", _signed("This is an S/MIME signed message\r\n\r\n" + PLAIN), True),
    ("an epilogue", _signed(PLAIN + "after\r\n--b1\r\n"), True),
    ("the close boundary ends the input", _signed(PLAIN[:-2]), True),
    ("an empty document", _signed(f"--b1\r\n{PART}\r\n--b1\r\n{SIG}--b1--\r\n"), True),
    ("a folded header", _signed(PLAIN, SIGNED.replace("; micalg", ";\r\n\tmicalg")), True),
    ("the boundary inside a line", _signed(
        f"--b1\r\n{PART}x --b1\r\n--b1x\r\n--b1\r\n{SIG}--b1--\r\n"), False),
    ("blanks after a boundary", _signed(PLAIN.replace("--b1\r\nContent-Type: app",
                                                      "--b1 \r\nContent-Type: app", 1)),
     False),
    ("no close boundary", _signed(PLAIN.replace("--b1--\r\n", "")), False),
    ("a repeated boundary", _signed(PLAIN.replace("--b1\r\n", "--b1\r\n--b1\r\n", 1)), False),
    ("no start boundary", _signed("just text\r\n"), False),
    ("a part without headers", _signed(f"--b1\r\n\r\nISA\r\n--b1\r\n{SIG}--b1--\r\n"), False),
    ("a part without its empty line", _signed(
        f"--b1\r\nContent-Type: text/plain\r\n--b1\r\n{SIG}--b1--\r\n"), False),
    ("the empty line is the boundary's", _signed(
        f"--b1\r\nContent-Type: text/plain\r\n\r\n--b1\r\n{SIG}--b1--\r\n"), False),
    ("a nested multipart", _signed(PLAIN.replace(
        "application/edi-x12", "multipart/mixed; boundary=in", 1)), False),
    ("a message part", _signed(PLAIN.replace("application/edi-x12", "message/rfc822", 1)),
     False),
    ("line breaks LF", _signed(PLAIN).replace(b"\r\n", b"\n"), False),
    ("a bare CR in a part", _signed(PLAIN.replace("X~", "X\r~")), False),
    ("a base64 multipart", _signed(PLAIN, SIGNED.replace(
        "\r\n\r\n", "\r\nContent-Transfer-Encoding: base64\r\n\r\n")), False),
    ("no boundary parameter", _signed(PLAIN, SIGNED.replace('; boundary="b1"', "")), False),
    ("a continuation first", _signed(PLAIN, " x\r\n" + SIGNED), False),
    ("a line not a header", _signed(PLAIN, "not a header\r\n" + SIGNED), False),
    ("an envelope line", _signed(PLAIN, "From someone\r\n" + SIGNED), False),
    ("an empty name", _signed(PLAIN, ": value\r\n" + SIGNED), False),
    ("no headers", b"\r\nbody", False),
    ("no empty line", b"Content-Type: text/plain\r\n", False),
    ("nothing", b"", False),
    ("another multipart", _signed(PLAIN, SIGNED.replace("multipart/signed",
                                                        "multipart/mixed")), False),
    ("a message", b"Content-Type: message/rfc822\r\n\r\nSubject: x\r\n\r\nbody", False),
    ("one entity", b"Content-Type: application/pkcs7-mime; smime-type=enveloped-data\r\n"
     b"Content-Transfer-Encoding: binary\r\n\r\n\x00\r\x80\nbinary\r\n\r\n", True),
    ("one entity, non-ASCII bytes in a header", "X-N: caf\xe9\r\n\r\nbody".encode(
        "latin-1"), True),
]


@pytest.mark.parametrize("shape,data,ours", SHAPES, ids=[s[0] for s in SHAPES])
def test_each_shape_is_read_as_the_email_package_reads_it_or_left_to_it(shape, data, ours):
    assert (_read(data) is not None) is ours


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([
    "--b1", "--b1--", "--b1 ", "--b1x", "", "Content-Type: text/plain", " folded",
    "ISA*00*~", "x --b1", "Content-Type: message/rfc822", "\r", "\n", "From x",
    "Content-Transfer-Encoding: base64"]), max_size=14),
    st.sampled_from(["\r\n", "\n"]), st.booleans())
def test_any_arrangement_of_lines_is_read_as_the_email_package_reads_it(lines, eol, last):
    data = _signed(eol.join(lines) + (eol if last else ""))
    _read(data)  # the same entities, or left to the email package
