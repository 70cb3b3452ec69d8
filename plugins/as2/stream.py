"""Large AS2 messages, streamed through temporary files (docs/as2.md "Large messages").

pyas2lib builds and parses a whole message in memory, several copies of it at once (the
body, the decrypted MIME tree, the signed part canonicalised, the content): a 100 MB
message peaked at 1.8 GB receiving. Above the receiver's and the sender's
``stream_threshold`` the same work is done here, with bounded buffers:

* the MIME layers are split and assembled on files, by byte ranges (a header block is
  read whole, up to :data:`HEAD_LIMIT`; a body never is);
* CMS is framed here in DER, chunk by chunk, and only the small parts of it (recipient
  infos, algorithm identifiers, signer infos) are built or read with ``asn1crypto``;
  the content goes through OpenSSL in pieces (``cryptography``'s ciphers, zlib, hashlib):
  EnvelopedData with AES, 3DES, DES or RC4 and the content key wrapped as
  :mod:`.keywrap` does (PKCS#1 v1.5, RSAES-OAEP with SHA-1/2); CompressedData with zlib
  (this machine's ``openssl cms`` has no zlib); detached SignedData with PKCS#1 v1.5 or
  PSS signatures over signed attributes whose message digest is hashed from the file;
* the MIC is hashed over exactly the bytes signed (or, unsigned, over the MIME content as
  :func:`.lib.content_mic` defines it).

What pyas2lib checks is checked the same way, with the same exceptions (so the history
texts and MDN dispositions stay the same): a partner that must encrypt or sign and did
not, a signature that fails, content that does not decrypt or decompress. Temp files
live in the payload store's ``tmp`` directory (cleaned with its stale temp files should
a process die) and are removed when the message is done.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import quopri
import re
import secrets
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy
from email import utils as email_utils
from email.header import decode_header, make_header
from email.message import Message as EmailMessage
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import IO

from asn1crypto import algos, cms, core
from cryptography import x509
from cryptography.hazmat.decrepit.ciphers.algorithms import ARC4, TripleDES
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import padding as block_padding
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.serialization import Encoding
from pyas2lib.exceptions import (
    AS2Exception,
    DecompressionError,
    DecryptionError,
    InsufficientSecurityError,
    IntegrityError,
)

from plugins.as2 import keywrap

CHUNK = 1 << 20
#: messages larger than this (bytes) are streamed, unless an instance says otherwise
DEFAULT_THRESHOLD = 8 << 20
#: the largest MIME header block read (an entity's headers are read whole)
HEAD_LIMIT = 64 * 1024
#: the largest CMS element other than the content read whole (recipients, signers)
ELEMENT_LIMIT = 4 << 20
_HASHES = {"sha1": hashes.SHA1, "sha224": hashes.SHA224, "sha256": hashes.SHA256,
           "sha384": hashes.SHA384, "sha512": hashes.SHA512, "md5": hashes.MD5}


#: the RFC 6017 features b2bhub implements, as its messages advertise them
EDIINT_FEATURES = "CEM"


def threshold(config: dict | None) -> int:
    """The instance's ``stream_threshold`` in bytes (0: stream every message)."""
    value = (config or {}).get("stream_threshold")
    return DEFAULT_THRESHOLD if value is None else int(value)


# --- temp files ---------------------------------------------------------------------

class Workspace:
    """The temp files of one message, in the payload store's ``tmp`` directory (the
    store's file system: a stage written here is linked into the store, not copied),
    removed together by :meth:`close`."""

    def __init__(self, store_root: str | Path):
        self.dir = Path(store_root) / "tmp"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.paths: list[Path] = []

    def new(self, what: str) -> Path:
        fd, name = tempfile.mkstemp(dir=self.dir, prefix=f"as2-{what}-")
        os.close(fd)
        self.paths.append(Path(name))
        return self.paths[-1]

    def close(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)
        self.paths = []

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def file_chunks(path: Path, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The bytes of ``path`` from ``start`` to ``end`` (None: its end), in chunks."""
    with open(path, "rb") as f:
        f.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            chunk = f.read(CHUNK if left is None else min(CHUNK, left))
            if not chunk:
                return
            if left is not None:
                left -= len(chunk)
            yield chunk


class ChunkReader(io.RawIOBase):
    """A readable stream of the chunks an iterable yields (payload store puts, HTTP)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            self._left = next(self._chunks, None)
            if self._left is None:
                self._left = b""
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def _write(out: IO[bytes], chunks: Iterable[bytes]) -> int:
    total = 0
    for chunk in chunks:
        out.write(chunk)
        total += len(chunk)
    return total


# --- DER and BER, framed here -------------------------------------------------------

def der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    octets = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(octets)]) + octets


def der_head(tag: int, n: int) -> bytes:
    return bytes([tag]) + der_length(n)


class BerReader:
    """Reads BER (definite and indefinite lengths, constructed strings) from a stream,
    element by element: small elements whole, the content in chunks."""

    def __init__(self, stream: IO[bytes]):
        self.stream = stream
        self.pos = 0

    def exact(self, n: int) -> bytes:
        parts, left = [], n
        while left:
            chunk = self.stream.read(min(left, CHUNK))
            if not chunk:
                raise ValueError("the CMS structure is truncated")
            parts.append(chunk)
            left -= len(chunk)
        self.pos += n
        return b"".join(parts)

    def head(self) -> tuple[int, int | None, bytes]:
        """(tag, length or None for indefinite, the header's bytes)."""
        first = self.exact(2)
        tag, size = first[0], first[1]
        if tag & 0x1F == 0x1F:
            raise ValueError("unsupported ASN.1 tag")
        if size == 0x80:
            return tag, None, first
        if size < 0x80:
            return tag, size, first
        more = self.exact(size & 0x7F)
        return tag, int.from_bytes(more, "big"), first + more

    def expect(self, tag: int, what: str) -> int | None:
        found, length, _ = self.head()
        if found != tag:
            raise ValueError(f"{what} not found in ASN.1 (tag {found:#x})")
        return length

    def element(self) -> bytes:
        """One whole element, as encoded (up to :data:`ELEMENT_LIMIT`)."""
        tag, length, header = self.head()
        if length is not None:
            if length > ELEMENT_LIMIT:
                raise ValueError("an ASN.1 element is too large")
            return header + self.exact(length)
        parts, total = [header], 0
        while True:
            child = self.element()
            parts.append(child)
            total += len(child)
            if total > ELEMENT_LIMIT:
                raise ValueError("an ASN.1 element is too large")
            if child == b"\0\0":
                return b"".join(parts)

    def octets(self, tag: int, length: int | None) -> Iterator[bytes]:
        """The content of an OCTET STRING (or one implicitly tagged), primitive or
        constructed, in chunks."""
        if not tag & 0x20:
            left = length or 0
            while left:
                chunk = self.exact(min(left, CHUNK))
                left -= len(chunk)
                yield chunk
            return
        end = None if length is None else self.pos + length
        while end is None or self.pos < end:
            child, size, _ = self.head()
            if child == 0 and size == 0 and end is None:
                return
            yield from self.octets(child, size)

    def close(self, length: int | None) -> None:
        """The end of a constructed element read by its parts: EOC when indefinite."""
        if length is None and self.exact(2) != b"\0\0":
            raise ValueError("end of an indefinite-length ASN.1 element not found")


def _oid(reader: BerReader) -> str:
    return core.ObjectIdentifier.load(reader.element()).native


# --- MIME entities on files ---------------------------------------------------------

_BLANK = re.compile(rb"\r?\n\r?\n")


@dataclass
class Entity:
    """A MIME entity, a byte range of a file: its header block (parsed) and its body."""

    path: Path
    start: int
    body: int
    end: int
    headers: EmailMessage

    def content_type(self) -> str:
        return self.headers.get_content_type()

    def param(self, name: str) -> str | None:
        value = self.headers.get_param(name)
        return str(value) if value is not None else None

    def chunks(self) -> Iterator[bytes]:
        """The whole entity as it is, headers included."""
        return file_chunks(self.path, self.start, self.end)

    def body_chunks(self) -> Iterator[bytes]:
        """The body decoded per its Content-Transfer-Encoding."""
        raw = file_chunks(self.path, self.body, self.end)
        encoding = str(self.headers.get("content-transfer-encoding", "")).strip().lower()
        if encoding == "base64":
            return _unbase64(raw)
        if encoding == "quoted-printable":
            return _unquote_printable(raw)
        return raw

    def body_stream(self) -> IO[bytes]:
        return io.BufferedReader(ChunkReader(self.body_chunks()), CHUNK)


def read_entity(path: Path, start: int = 0, end: int | None = None,
                headers: EmailMessage | None = None) -> Entity:
    """The entity at ``path[start:end]``; with ``headers``, the range is its body alone
    (an HTTP body, whose headers came with the request)."""
    end = path.stat().st_size if end is None else end
    if headers is not None:
        return Entity(path, start, start, end, headers)
    with open(path, "rb") as f:
        f.seek(start)
        head = f.read(min(HEAD_LIMIT, end - start))
    if head.startswith((b"\r\n", b"\n")):  # no headers at all
        skip = 2 if head.startswith(b"\r\n") else 1
        return Entity(path, start, start + skip, end, EmailMessage())
    found = _BLANK.search(head)
    if found is None:
        raise AS2Exception("the MIME headers of a part are missing or too long")
    parsed = BytesHeaderParser(policy=policy.compat32).parsebytes(head[:found.start()])
    return Entity(path, start, start + found.end(), end, parsed)


def _unbase64(chunks: Iterable[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        data = pending + chunk.translate(None, b" \t\r\n")
        cut = len(data) // 4 * 4
        pending = data[cut:]
        if cut:
            yield binascii.a2b_base64(data[:cut])
    if pending:
        yield binascii.a2b_base64(pending + b"=" * (-len(pending) % 4))


def _unquote_printable(chunks: Iterable[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        data = pending + chunk
        cut = data.rfind(b"\n") + 1
        pending = data[cut:]
        if cut:
            yield quopri.decodestring(data[:cut])
    if pending:
        yield quopri.decodestring(pending)


def _crlf(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Line ends made CRLF (a bare LF gets its CR), as a text canonicalisation does."""
    after_cr = False
    for chunk in chunks:
        if not chunk:
            continue
        out = re.sub(rb"(?<!\r)\n", b"\r\n", chunk)
        if after_cr and chunk.startswith(b"\n"):
            out = out[1:]  # this LF's CR ended the previous chunk
        after_cr = chunk.endswith(b"\r")
        yield out


def header_lines(message: EmailMessage) -> bytes:
    """Headers as pyas2lib writes them for what it signs and sends: ``Name: value``."""
    return "".join(f"{k}: {v}\r\n" for k, v in message.items()).encode("utf-8")


def split_signed(entity: Entity) -> tuple[Entity, bytes]:
    """(the signed part, the signature's bytes) of a multipart/signed entity. The first
    boundary is looked for at the body's start, the second and the closing one in its
    last :data:`ELEMENT_LIMIT` bytes (the signature part is small): the signed part,
    however large, is never scanned (a boundary cannot occur in it)."""
    boundary = entity.param("boundary")
    if not boundary:
        raise AS2Exception("multipart/signed without a boundary")
    mark = b"--" + boundary.encode("utf-8", "replace")
    with open(entity.path, "rb") as f:
        f.seek(entity.body)
        head = b"\n" + f.read(min(HEAD_LIMIT, entity.end - entity.body))
        tail_at = max(entity.body, entity.end - ELEMENT_LIMIT)
        f.seek(tail_at)
        tail = b"\n" + f.read(entity.end - tail_at)
    first = _delimiter(head, mark, 0, len(head))
    closing = _delimiter(tail, mark, 0, len(tail), closing=True, last=True)
    second = _delimiter(tail, mark, 0, closing[0], last=True) if closing else None
    if first is None or closing is None or second is None:
        raise AS2Exception("multipart/signed without its two parts")
    # offsets in the file (both buffers start with the "\n" put before them)
    start = entity.body + first[1] - 1
    part_end, sig_start = tail_at + second[0] - 1, tail_at + second[1] - 1
    if part_end < start:
        raise AS2Exception("multipart/signed without its two parts")
    signed = read_entity(entity.path, start, max(start, part_end))
    sig = read_entity(entity.path, sig_start, tail_at + closing[0] - 1)
    if sig.content_type() not in ("application/pkcs7-signature",
                                  "application/x-pkcs7-signature"):
        raise IntegrityError("no signature part after the signed part of multipart/signed")
    return signed, b"".join(sig.body_chunks())


def _delimiter(data: bytes, mark: bytes, lo: int, hi: int, closing: bool = False,
               last: bool = False) -> tuple[int, int] | None:
    """(start, end) of a boundary line in ``data[lo:hi]``: start at the line break
    before it (which belongs to the boundary), end after its own line break."""
    at = data.rfind(b"\n" + mark, lo, hi) if last else data.find(b"\n" + mark, lo, hi)
    while at >= 0:
        line_end = data.find(b"\n", at + 1)
        line_end = len(data) if line_end < 0 else line_end + 1
        rest = data[at + 1 + len(mark):line_end].rstrip(b"\r\n \t")
        if rest == (b"--" if closing else b""):
            start = at - 1 if at > 0 and data[at - 1:at] == b"\r" else at
            return start, line_end
        at = data.rfind(b"\n" + mark, lo, at) if last else data.find(b"\n" + mark, at + 1, hi)
    return None


# --- CMS content encryption ---------------------------------------------------------

def _content_cipher(alg: cms.EncryptionAlgorithm, key: bytes):
    """(pyas2lib's name of the cipher, a cryptography Cipher, block size in bits or
    None for a stream cipher) of an envelope's content encryption algorithm."""
    name = alg["algorithm"].native
    if name == "rc4":
        return "rc4_128_cbc", Cipher(ARC4(key), None), None
    kind = alg.encryption_cipher
    if kind == "aes":
        return (f"aes_{len(key) * 8}_cbc",
                Cipher(algorithms.AES(key), modes.CBC(alg.encryption_iv)), 128)
    if kind == "tripledes":
        return "tripledes_192_cbc", Cipher(TripleDES(key), modes.CBC(alg.encryption_iv)), 64
    if kind == "des":
        return "des_64_cbc", Cipher(TripleDES(key * 3), modes.CBC(alg.encryption_iv)), 64
    raise DecryptionError(f"Failed to decrypt the payload: {name} is not supported for a "
                          "message above the stream threshold")


def _plain(cipher: Cipher, block: int | None, chunks: Iterable[bytes]) -> Iterator[bytes]:
    decryptor = cipher.decryptor()
    unpadder = block_padding.PKCS7(block).unpadder() if block else None
    for chunk in chunks:
        out = decryptor.update(chunk)
        yield unpadder.update(out) if unpadder else out
    out = decryptor.finalize()
    if unpadder:
        yield unpadder.update(out) + unpadder.finalize()  # ValueError: bad padding
    else:
        yield out


def decrypt(open_body: Callable[[], IO[bytes]], keys, out_path: Path) -> str:
    """Decrypt the DER/BER EnvelopedData that ``open_body()`` reads into ``out_path``;
    ``keys``: (cryptography RSA key, certificate) pairs. The cipher's name. Raises
    pyas2lib's DecryptionError (a content key of a wrong key decrypts to bad padding,
    then the next candidate key is tried, reading the envelope again)."""
    def envelope(stream):
        reader = BerReader(stream)
        outer = reader.expect(0x30, "ContentInfo")
        if _oid(reader) != "1.2.840.113549.1.7.3":
            raise DecryptionError("Encrypted data not found in ASN.1 ")
        reader.expect(0xA0, "EnvelopedData")
        reader.expect(0x30, "EnvelopedData")
        reader.element()  # version
        element = reader.element()
        if element[0] == 0xA0:  # originator info
            element = reader.element()
        recipients = cms.RecipientInfos.load(element)
        reader.expect(0x30, "EncryptedContentInfo")
        reader.element()  # content type
        algorithm = cms.EncryptionAlgorithm.load(reader.element())
        tag, length, _ = reader.head()
        if tag not in (0x80, 0xA0):
            raise DecryptionError("Failed to decrypt the payload: no encrypted content")
        return reader, recipients, algorithm, tag, length, outer

    try:
        with open_body() as stream:
            _r, recipients, algorithm, _t, _l, _o = envelope(stream)
        candidates = keywrap.content_keys([r.chosen for r in recipients if r.name == "ktri"],
                                          keys)
        failure: Exception | None = None
        try:
            for key in candidates:
                name, cipher, block = _content_cipher(algorithm, key)
                try:
                    with open_body() as stream, open(out_path, "wb") as out:
                        reader, _rec, _alg, tag, length, _o = envelope(stream)
                        _write(out, _plain(cipher, block, reader.octets(tag, length)))
                    return name
                except ValueError as exc:  # bad padding: a wrong content key; the next
                    failure = exc
        except DecryptionError:  # no more candidates: say why the last one failed
            if failure is None:
                raise
        raise DecryptionError(f"Failed to decrypt the payload: {failure}")
    except (AS2Exception, OSError):
        raise
    except Exception as exc:  # not DER, not CMS, truncated
        raise DecryptionError(f"Failed to decrypt the payload: {exc}") from exc


def encrypt(plain: Callable[[], Iterator[bytes]], size: int, enc_alg: str,
            cert: x509.Certificate, wrap: str | None, out: IO[bytes]) -> None:
    """Write a DER EnvelopedData of the ``size`` bytes ``plain()`` yields, for ``cert``,
    the content key wrapped with RSAES-OAEP with ``wrap`` (None: PKCS#1 v1.5)."""
    kind, bits = enc_alg.split("_")[:2]
    key = os.urandom(int(bits) // 8)
    if kind == "rc4":
        cipher, block, iv = Cipher(ARC4(key), None), None, None
    elif kind in ("aes", "tripledes"):
        iv = os.urandom(16 if kind == "aes" else 8)
        cipher = Cipher(algorithms.AES(key) if kind == "aes" else TripleDES(key),
                        modes.CBC(iv))
        block = 128 if kind == "aes" else 64
    else:
        raise AS2Exception(f"Unsupported Encryption Algorithm {enc_alg} for a message "
                           "streamed above the stream threshold")
    algorithm = cms.EncryptionAlgorithm(keywrap.content_algorithm(enc_alg, iv)).dump()
    recipients = cms.RecipientInfos([cms.RecipientInfo(
        name="ktri", value=keywrap.recipient(cert, key, wrap))]).dump()
    length = size if block is None else (size // (block // 8) + 1) * (block // 8)
    data_oid = core.ObjectIdentifier("1.2.840.113549.1.7.1").dump()
    content_head = der_head(0x80, length)
    info = data_oid + algorithm + content_head
    info_head = der_head(0x30, len(info) + length)
    version = core.Integer(0).dump()
    inner = len(version) + len(recipients) + len(info_head) + len(info) + length
    env_head = der_head(0x30, inner)
    explicit = der_head(0xA0, len(env_head) + inner)
    oid = core.ObjectIdentifier("1.2.840.113549.1.7.3").dump()
    out.write(der_head(0x30, len(oid) + len(explicit) + len(env_head) + inner) + oid
              + explicit + env_head + version + recipients + info_head + info)
    encryptor = cipher.encryptor()
    padder = block_padding.PKCS7(block).padder() if block else None
    written = 0
    for chunk in plain():
        piece = encryptor.update(padder.update(chunk) if padder else chunk)
        out.write(piece)
        written += len(piece)
    last = encryptor.update(padder.finalize()) if padder else b""
    last += encryptor.finalize()
    out.write(last)
    if written + len(last) != length:
        raise AS2Exception("the content to encrypt changed size while it was read")


# --- CMS compressed data --------------------------------------------------------------

_ZLIB = "1.2.840.113549.1.9.16.3.8"
_COMPRESSED = "1.2.840.113549.1.9.16.1.9"


def decompress(stream: IO[bytes], out: IO[bytes]) -> None:
    """Inflate a DER/BER CompressedData (zlib) from ``stream`` into ``out``."""
    try:
        reader = BerReader(stream)
        reader.expect(0x30, "ContentInfo")
        if _oid(reader) != _COMPRESSED:
            raise DecompressionError("Compressed data not found in ASN.1 ")
        reader.expect(0xA0, "CompressedData")
        reader.expect(0x30, "CompressedData")
        reader.element()  # version
        algorithm = cms.CompressionAlgorithm.load(reader.element())
        if algorithm["algorithm"].dotted != _ZLIB:
            raise DecompressionError(f"Unsupported compression algorithm "
                                     f"{algorithm['algorithm'].dotted}")
        reader.expect(0x30, "EncapsulatedContentInfo")
        reader.element()  # content type
        reader.expect(0xA0, "compressed content")
        tag, length, _ = reader.head()
        inflate = zlib.decompressobj()
        for chunk in reader.octets(tag, length):
            out.write(inflate.decompress(chunk))
            while inflate.unconsumed_tail:
                out.write(inflate.decompress(inflate.unconsumed_tail))
        out.write(inflate.flush())
        if not inflate.eof:
            raise ValueError("the compressed content is truncated")
    except (AS2Exception, OSError):
        raise
    except Exception as exc:
        raise DecompressionError(f"Decompression failed with cause: {exc}") from exc


def compress(chunks: Iterable[bytes], ws: Workspace) -> tuple[Path, bytes, int]:
    """zlib of ``chunks`` into a temp file: (that file, the DER header of the
    CompressedData around it, the file's size)."""
    path = ws.new("zlib")
    deflate = zlib.compressobj()
    with open(path, "wb") as out:
        for chunk in chunks:
            out.write(deflate.compress(chunk))
        out.write(deflate.flush())
    size = path.stat().st_size
    octets = der_head(0x04, size)
    explicit = der_head(0xA0, len(octets) + size)
    data_oid = core.ObjectIdentifier("1.2.840.113549.1.7.1").dump()
    encap = data_oid + explicit + octets
    encap_head = der_head(0x30, len(encap) + size)
    algorithm = cms.CompressionAlgorithm({"algorithm": "zlib"}).dump()
    version = core.Integer(0).dump()
    body = version + algorithm + encap_head + encap
    body_head = der_head(0x30, len(body) + size)
    wrap = der_head(0xA0, len(body_head) + len(body) + size)
    oid = core.ObjectIdentifier(_COMPRESSED).dump()
    head = oid + wrap + body_head + body
    return path, der_head(0x30, len(head) + size) + head, size


# --- CMS signatures (detached) --------------------------------------------------------

def digest_of(chunks: Iterable[bytes], alg: str) -> bytes:
    hasher = hashlib.new(alg)
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.digest()


def sign(digest: bytes, digest_alg: str, key: rsa.RSAPrivateKey,
         cert: x509.Certificate) -> bytes:
    """A detached DER SignedData whose signed attributes carry ``digest`` (the
    ``digest_alg`` hash of the content, hashed by the caller from its file), signed
    with PKCS#1 v1.5, the signer's certificate included (as pyas2lib signs)."""
    attrs = cms.CMSAttributes([
        cms.CMSAttribute({"type": "content_type", "values": ["data"]}),
        cms.CMSAttribute({"type": "signing_time",
                          "values": [cms.Time({"utc_time": core.UTCTime(
                              datetime.now(UTC).replace(microsecond=0))})]}),
        cms.CMSAttribute({"type": "message_digest", "values": [digest]}),
    ])
    signature = key.sign(attrs.dump(), padding.PKCS1v15(), _HASHES[digest_alg]())
    asn1_cert = cms.Certificate.load(cert.public_bytes(Encoding.DER))
    signer = cms.SignerInfo({
        "version": "v1",
        "sid": cms.SignerIdentifier({"issuer_and_serial_number": cms.IssuerAndSerialNumber(
            {"issuer": asn1_cert.issuer, "serial_number": asn1_cert.serial_number})}),
        "digest_algorithm": algos.DigestAlgorithm({"algorithm": digest_alg}),
        "signed_attrs": attrs,
        "signature_algorithm": algos.SignedDigestAlgorithm({"algorithm": "rsassa_pkcs1v15"}),
        "signature": signature})
    return cms.ContentInfo({"content_type": "signed_data", "content": cms.SignedData({
        "version": "v1",
        "digest_algorithms": [algos.DigestAlgorithm({"algorithm": digest_alg})],
        "encap_content_info": {"content_type": "data"},
        "certificates": [asn1_cert],
        "signer_infos": [signer]})}).dump()


def verify(signature: bytes, digest: Callable[[str], bytes],
           certs: list[x509.Certificate]) -> str:
    """Check a detached SignedData against the content whose hash ``digest(alg)``
    gives and the partner's certificates (any of them); its digest algorithm. Raises
    pyas2lib's IntegrityError with the reason."""
    try:
        info = cms.ContentInfo.load(signature)
        signed = info["content"]
        signer = signed["signer_infos"][0]
        alg = signer["digest_algorithm"]["algorithm"].native
        sig_alg = signer["signature_algorithm"]
        value = signer["signature"].native
        attrs = signer["signed_attrs"]
    except Exception as exc:
        raise IntegrityError(f"Failed to verify message signature: {exc}") from exc
    if alg not in _HASHES:
        raise IntegrityError(f"Failed to verify message signature: unsupported digest {alg}")
    content = digest(alg)
    if attrs.native:
        found = next((a["values"][0].native for a in attrs
                      if a["type"].native == "message_digest"), None)
        if found != content:
            raise IntegrityError("Failed to verify message signature: Message Digest "
                                 "does not match.")
        data, hash_alg = b"\x31" + attrs.dump()[1:], _HASHES[alg]()
    else:
        data, hash_alg = content, Prehashed(_HASHES[alg]())
    if sig_alg.signature_algo == "rsassa_pss":
        # the parameters name the hash (pyas2lib writes none: then the digest's, with
        # MGF1 of the same); the salt's length is read from the signature itself
        params = sig_alg["parameters"]
        named = params["hash_algorithm"]["algorithm"].native \
            if isinstance(params, algos.RSASSAPSSParams) else alg
        pss_hash = _HASHES[named]()
        pad = padding.PSS(mgf=padding.MGF1(pss_hash), salt_length=padding.PSS.AUTO)
        hash_alg = pss_hash if attrs.native else Prehashed(pss_hash)
    else:
        pad = padding.PKCS1v15()
    problem = "no certificate to verify the signature with"
    for cert in certs:
        public = cert.public_key()
        if not isinstance(public, rsa.RSAPublicKey):
            problem = "the partner's certificate is not an RSA one"
            continue
        try:
            public.verify(value, data, pad, hash_alg)
            return alg
        except Exception:
            problem = "the signature does not verify with the partner's certificate"
    raise IntegrityError(f"Failed to verify message signature: {problem}")


# --- a received message ----------------------------------------------------------------

@dataclass
class Received:
    """What a streamed parse found (the parts of pyas2lib's Message the receiver uses)."""

    status: str = "processed"
    exc: Exception | None = None
    payload: Entity | None = None
    mic: bytes | None = None
    digest_alg: str | None = None
    encrypted: bool = False
    signed: bool = False
    compressed: bool = False
    merged: EmailMessage = field(default_factory=EmailMessage)  # payload + AS2 headers

    def filename(self) -> str | None:
        return decoded_filename(self.merged)


def decoded_filename(part) -> str | None:
    """The file name of a MIME entity's ``Content-Disposition`` (else ``Content-Type``'s
    ``name``), decoded; None when it has none or it cannot be read. RFC 2231 parameters
    (``filename*=UTF-8''%E2%82%AC.csv``, a charset and language, continuations
    ``filename*0*``, ``filename*1``) are decoded by the email package; RFC 2047 encoded
    words (``filename="=?UTF-8?B?...?="``), which RFC 2047 section 5 does not allow in a
    parameter but mail-derived AS2 products send, are decoded here. The caller still
    sanitises the result (no directories, no NUL)."""
    try:
        name = part.get_filename()
        if name and "=?" in name:
            name = str(make_header(decode_header(name)))
    except Exception:  # a charset Python does not know, a malformed word: no name
        return None
    return name


def receive(ws: Workspace, path: Path, body_at: int, http: EmailMessage, partner,
            decrypt_keys: Callable[[], list], verify_certs: Callable[[], list],
            receipt_alg: str | None, content_head: Callable[[EmailMessage], bytes]
            ) -> Received:
    """Parse the message whose raw stage is ``path`` (the HTTP header block, then the
    body from ``body_at``): decrypt, decompress, verify, MIC; as pyas2lib's
    ``Message.parse`` (``partner``: the pyas2lib Partner, for what it must send)."""
    result = Received(merged=_merged(EmailMessage(), http))
    partner_id = http.get("as2-from")
    try:
        current = read_entity(path, body_at, headers=http)
        if partner.encrypt and current.content_type() != "application/pkcs7-mime":
            raise InsufficientSecurityError(
                f"Incoming messages from partner {partner_id} are must be encrypted "
                f"but encrypted message not found.")
        if current.content_type() == "application/pkcs7-mime" \
                and current.param("smime-type") == "enveloped-data":
            result.encrypted = True
            clear = ws.new("clear")
            decrypt(current.body_stream, decrypt_keys(), clear)
            current = read_entity(clear)
            if current.content_type() == "text/plain":  # pyas2lib: the whole is content
                current = read_entity(clear, headers=_typed("application/edi-consent"))
        current = _decompressed(ws, current, result)
        if partner.sign and current.content_type() != "multipart/signed":
            raise InsufficientSecurityError(
                f"Incoming messages from partner {partner_id} are must be signed "
                f"but signed message not found.")
        if current.content_type() == "multipart/signed":
            result.signed = True
            current, signature = split_signed(current)
            certs = verify_certs()
            result.digest_alg, result.mic = _verified(ws, current, signature, certs)
        if not result.compressed:
            current = _decompressed(ws, current, result)
    except OSError:  # the hub's own files, not the message: 503, nothing accepted
        raise
    except Exception as exc:
        result.status = getattr(exc, "disposition_type", "processed/Error")
        result.exc = exc
        return result
    result.payload = current
    result.merged = _merged(current.headers, http)
    if result.mic is None and receipt_alg:
        hasher = hashlib.new(receipt_alg, content_head(result.merged) + b"\r\n")
        for chunk in current.body_chunks():
            hasher.update(chunk)
        result.mic, result.digest_alg = binascii.b2a_base64(hasher.digest()).strip(), \
            receipt_alg
    return result


def refused(exc: AS2Exception, http: EmailMessage) -> Received:
    """What a parse refused before it began (no organization to receive it) found."""
    return Received(status=exc.disposition_type, exc=exc, merged=_merged(EmailMessage(), http))


def _typed(content_type: str) -> EmailMessage:
    message = EmailMessage()
    message["Content-Type"] = content_type
    return message


def _decompressed(ws: Workspace, current: Entity, result: Received) -> Entity:
    if current.content_type() == "application/pkcs7-mime" \
            and current.param("smime-type") == "compressed-data":
        result.compressed = True
        inflated = ws.new("inflated")
        with current.body_stream() as stream, open(inflated, "wb") as out:
            decompress(stream, out)
        return read_entity(inflated)
    return current


def _verified(ws: Workspace, part: Entity, signature: bytes, certs) -> tuple[str, bytes]:
    """(digest algorithm, MIC) of a signed part whose signature verifies over its bytes
    as received, or else over its text canonicalisation (line ends CRLF) or its headers
    as pyas2lib writes them: partners differ on what they sign."""
    ways = [part.chunks]
    rewritten = header_lines(part.headers) + b"\r\n"
    if rewritten != b"".join(file_chunks(part.path, part.start, part.body)):
        ways.append(lambda: chained(rewritten, file_chunks(part.path, part.body, part.end)))
    ways.append(lambda: _crlf(part.chunks()))
    error: Exception | None = None
    for way in ways:
        digests: dict[str, bytes] = {}

        def digest(alg, way=way, digests=digests):
            if alg not in digests:
                digests[alg] = digest_of(way(), alg)
            return digests[alg]
        try:
            alg = verify(signature, digest, certs)
        except IntegrityError as exc:
            if error is None:
                error = exc
            if "Message Digest does not match" not in str(exc):
                raise  # the signature itself is bad: no other bytes make it good
            continue
        return alg, base64.b64encode(digest(alg))
    raise error


def chained(head: bytes, *rests: Iterable[bytes]) -> Iterator[bytes]:
    yield head
    for rest in rests:
        yield from rest


def _merged(payload: EmailMessage, http: EmailMessage) -> EmailMessage:
    """The payload's headers with the request's added, as pyas2lib merges them (its
    Content-* headers kept, the request's appended, lower-cased)."""
    merged = EmailMessage()
    for k, v in payload.items():
        merged[k] = v
    for k, v in http.items():
        k = k.lower()
        if merged.get(k) and k not in ("content-type", "content-disposition",
                                       "content-transfer-encoding"):
            del merged[k]
        merged[k] = v
    return merged


# --- a message to send -----------------------------------------------------------------

@dataclass
class Built:
    """A message built on files: its headers, the body file, MIC and Message-ID."""

    headers: dict
    body: Path
    message_id: str
    mic: bytes | None
    digest_alg: str | None


@dataclass
class _Layer:
    """One MIME entity being built: its headers and its body (chunks, size)."""

    headers: EmailMessage
    body: Callable[[], Iterator[bytes]]
    size: int

    def head(self) -> bytes:
        return header_lines(self.headers) + b"\r\n"

    def whole(self) -> Iterator[bytes]:
        return chained(self.head(), self.body())

    def whole_size(self) -> int:
        return len(self.head()) + self.size


def _headers(content_type: str, params: dict, filename: str | None,
             encoding: str | None) -> EmailMessage:
    """A part's headers in the order pyas2lib writes them."""
    message = EmailMessage()
    message.set_type(content_type)
    for k, v in params.items():
        message.set_param(k, v)
    if filename:
        message.add_header("Content-Disposition", "attachment", filename=filename)
    if encoding:
        message.add_header("Content-Transfer-Encoding", encoding)
    del message["MIME-Version"]
    return message


def build(ws: Workspace, source: IO[bytes], *, sender, receiver, filename: str | None,
          content_type: str, subject: str, message_id: str | None,
          disposition_notification_to: str, key_encryption: str | None,
          sign_with, encrypt_for, type_params: dict | None = None) -> Built:
    """Build what pyas2lib's ``Message.build`` builds, on files: the document (binary,
    as :func:`.lib.building` has it), compressed, then signed, then encrypted, per the
    pyas2lib ``receiver`` Partner. ``sign_with``: our (key, certificate);
    ``encrypt_for``: the partner's certificate (cryptography's objects)."""
    spool = ws.new("document")
    with open(spool, "wb") as out:
        size = _write(out, iter(lambda: source.read(CHUNK), b""))
    document = EmailMessage()
    document.set_type(content_type)
    for name, value in (type_params or {}).items():
        document.set_param(name, value)
    if not content_type.startswith("multipart/"):  # a multipart's parts say their own
        document["Content-Transfer-Encoding"] = "binary"
    if filename:
        document.add_header("Content-Disposition", "attachment", filename=filename)
    del document["MIME-Version"]
    layer = _Layer(document, lambda: file_chunks(spool), size)
    mic = digest_alg = None
    if not receiver.sign and receiver.mdn_digest_alg:  # an unsigned message's MIC
        digest_alg = receiver.mdn_digest_alg  # (lib.content_mic: the document's)
        mic = base64.b64encode(digest_of(layer.whole(), digest_alg))
    if receiver.compress:
        zpath, frame, zsize = compress(layer.whole(), ws)
        layer = _Layer(_headers("application/pkcs7-mime", {"name": "smime.p7z",
                                                           "smime-type": "compressed-data"},
                                "smime.p7z", "binary"),
                       lambda: chained(frame, file_chunks(zpath)), len(frame) + zsize)
    if receiver.sign:
        digest_alg = receiver.digest_alg
        digest = digest_of(layer.whole(), digest_alg)
        mic = base64.b64encode(digest)
        signature = sign(digest, digest_alg, *sign_with)
        boundary = "=" * 15 + secrets.token_hex(10) + "=="
        mark = b"--" + boundary.encode()
        sig_head = header_lines(_headers(
            "application/pkcs7-signature", {"name": "smime.p7s", "smime-type": "signed-data"},
            "smime.p7s", "base64"))
        closing = (b"\r\n" + mark + b"\r\n" + sig_head + b"\r\n"
                   + base64.encodebytes(signature).replace(b"\n", b"\r\n")
                   + b"\r\n" + mark + b"--\r\n")
        signed = layer
        layer = _Layer(_headers("multipart/signed", {
            "protocol": "application/pkcs7-signature", "micalg": digest_alg,
            "boundary": boundary}, None, None),
            lambda: chained(mark + b"\r\n", signed.whole(), [closing]),
            len(mark) + 2 + signed.whole_size() + len(closing))
    body = ws.new("body")
    with open(body, "wb") as out:
        if receiver.encrypt:
            encrypt(layer.whole, layer.whole_size(), receiver.enc_alg, encrypt_for,
                    keywrap.KEY_ENCRYPTIONS.get(key_encryption or ""), out)
        else:
            _write(out, layer.body())
    outer = layer.headers if not receiver.encrypt else _headers(
        "application/pkcs7-mime", {"name": "smime.p7m", "smime-type": "enveloped-data"},
        "smime.p7m", "binary")
    domain = sender.domain
    msgid = f"{message_id}@{domain}" if message_id else \
        email_utils.make_msgid(domain=domain).lstrip("<").rstrip(">")
    headers = dict(outer.items())
    # EDIINT-Features lists the RFC 6017 features b2bhub implements: CEM (:mod:`.cem`),
    # not multiple-attachments nor AS2-Reliability; pyas2lib's "CMS" is no such token
    headers.update({"AS2-Version": "1.2", "EDIINT-Features": EDIINT_FEATURES,
                    "Message-ID": f"<{msgid}>", "AS2-From": _quoted(sender.as2_name),
                    "AS2-To": _quoted(receiver.as2_name), "Subject": subject,
                    "Date": email_utils.formatdate(localtime=True)})
    if receiver.mdn_mode:
        headers["disposition-notification-to"] = disposition_notification_to
        if receiver.mdn_digest_alg:
            headers["disposition-notification-options"] = (
                f"signed-receipt-protocol=required, pkcs7-signature; "
                f"signed-receipt-micalg=optional, {receiver.mdn_digest_alg}")
        if receiver.mdn_mode == "ASYNC":
            if not sender.mdn_url:
                raise AS2Exception("MDN URL must be set in the organization when MDN mode "
                                   "is set to ASYNC")
            headers["receipt-delivery-option"] = sender.mdn_url
    return Built(headers, body, msgid, mic, digest_alg)


def _quoted(name: str) -> str:
    """An AS2 name as pyas2lib quotes it (``quote_as2name``)."""
    if re.search(r'[\\" ]', name):
        return '"' + email_utils.quote(name) + '"'
    return name
