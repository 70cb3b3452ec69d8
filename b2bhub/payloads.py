"""The content-addressed payload store on the filesystem (SPEC 11).

A payload is stored once under its sha256: ``<root>/<d[0:2]>/<d[2:4]>/<digest>``. It is
written to ``<root>/tmp`` first, fsynced and renamed into place, so a reader never sees
half a file, and it is written *before* the transaction that references it; the nightly
cleanup therefore only removes unreferenced files older than a grace period. Reads check
the sha256 at the end of the stream, so silent corruption on disk is never handed on as
a good payload. Plain Python: no Flask, no Celery, no SQLAlchemy.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "PayloadCorrupt",
    "PayloadError",
    "PayloadMissing",
    "PayloadStore",
    "StoredPayload",
    "VerifiedReader",
]

DIGEST_RE = re.compile(r"[0-9a-f]{64}")
SHARD_RE = re.compile(r"[0-9a-f]{2}")
READ_CHUNK = 1 << 16
TMP_DIR = "tmp"


class PayloadError(Exception):
    """A stored payload cannot be handed out; ``digest`` names it."""

    def __init__(self, digest: str, text: str):
        super().__init__(f"payload {digest}: {text}")
        self.digest = digest


class PayloadMissing(PayloadError):
    """No file is stored under the digest."""

    def __init__(self, digest: str):
        super().__init__(digest, "missing")


class PayloadCorrupt(PayloadError):
    """The stored bytes no longer hash to their digest."""

    def __init__(self, digest: str, actual: str = ""):
        super().__init__(digest, f"corrupt (content hashes to {actual or 'something else'})")
        self.actual = actual


@dataclass(frozen=True)
class StoredPayload:
    """What :meth:`PayloadStore.put` stored: the sha256 hex digest and the size in bytes."""

    digest: str
    size: int


def check_digest(digest: str) -> str:
    """Return ``digest`` if it is 64 lowercase hex digits; refuse anything else, so a
    digest taken from a request or a row can never name a path outside the store."""
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return digest


class VerifiedReader(io.RawIOBase):
    """A read-only stream over a stored payload that hashes what it hands out.

    Reaching the end of the stream raises :class:`PayloadCorrupt` when the bytes do not
    match the digest, so a consumer that reads to the end never takes a corrupt payload
    for a good one. Iterating yields chunks, not lines: payloads are binary.
    """

    def __init__(self, digest: str, file: BinaryIO):
        super().__init__()
        self.digest = digest
        self._file = file
        self._hash = hashlib.sha256()
        self.verified = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` from the file; at the end of the file check the digest."""
        if len(buffer) == 0:
            return 0
        count = self._file.readinto(buffer)
        if count:
            self._hash.update(memoryview(buffer)[:count])
        else:
            self._check_digest()
        return count

    def _check_digest(self) -> None:
        actual = self._hash.hexdigest()
        if actual != self.digest:
            raise PayloadCorrupt(self.digest, actual)
        self.verified = True

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        chunk = self.read(READ_CHUNK)
        if not chunk:
            raise StopIteration
        return chunk

    def close(self) -> None:
        self._file.close()
        super().close()


class PayloadStore:
    """Stores payloads by sha256 under ``root``; see the module docstring."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # writing -----------------------------------------------------------------
    def put(self, data: bytes | BinaryIO, chunk_size: int = 1 << 20) -> StoredPayload:
        """Store ``data`` (bytes or a binary stream read in chunks, never whole) and
        return its digest and size. Storing content that is already there keeps one copy."""
        tmp_dir = self.root / TMP_DIR
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=tmp_dir, prefix="put-")
        try:
            with os.fdopen(fd, "wb") as out:
                stored = _copy_hashing(_chunks(data, chunk_size), out)
                out.flush()
                os.fsync(out.fileno())
            self._place(Path(tmp_name), stored)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return stored

    def _place(self, tmp: Path, stored: StoredPayload) -> None:
        """Move a written temp file to its place, or drop it if the content is there."""
        final = self.path(stored.digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        if _same_size(final, stored.size):
            tmp.unlink()
            # Refresh the age so the orphan cleanup gives the new reference its grace period.
            os.utime(final)
            return
        os.replace(tmp, final)
        _fsync_dir(final.parent)

    # reading -----------------------------------------------------------------
    def path(self, digest: str) -> Path:
        """The file a digest is stored in (whether or not it exists)."""
        check_digest(digest)
        return self.root / digest[0:2] / digest[2:4] / digest

    def open(self, digest: str) -> VerifiedReader:
        """Open a stored payload for reading; the sha256 is checked at the end."""
        try:
            file = self.path(digest).open("rb")
        except FileNotFoundError:
            raise PayloadMissing(digest) from None
        return VerifiedReader(digest, file)

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        """The size in bytes of a stored payload."""
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            raise PayloadMissing(digest) from None

    def delete(self, digest: str) -> bool:
        """Remove a stored payload; False if there was none."""
        try:
            self.path(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    # cleanup -----------------------------------------------------------------
    def iter_digests(self) -> Iterator[str]:
        """Every digest stored, in no particular order (for the orphan cleanup)."""
        for digest, _path in self._iter_files():
            yield digest

    def _iter_files(self) -> Iterator[tuple[str, Path]]:
        for first in _shards(self.root):
            for second in _shards(first):
                for entry in os.scandir(second):
                    name = entry.name
                    if (
                        entry.is_file()
                        and DIGEST_RE.fullmatch(name)
                        and name[0:2] == first.name
                        and name[2:4] == second.name
                    ):
                        yield name, Path(entry.path)

    def remove_orphans(
        self, referenced: Callable[[str], bool] | Container[str], older_than_seconds: float = 3600
    ) -> int:
        """Delete stored payloads that are not referenced and older than the grace
        period, and temp files left by interrupted writes; return how many files went.

        The grace period protects a payload written just before the transaction that
        references it commits. ``referenced`` is a predicate or a container of digests.
        """
        is_referenced = referenced if callable(referenced) else referenced.__contains__
        cutoff = time.time() - older_than_seconds
        removed = 0
        for digest, path in list(self._iter_files()):
            if not _older(path, cutoff) or is_referenced(digest):
                continue
            # Age is checked again after the lookup: a put of the same content in
            # between refreshes it, and that new reference must survive.
            if _older(path, cutoff):
                removed += _unlink(path)
        return removed + self._remove_old_temp_files(cutoff)

    def _remove_old_temp_files(self, cutoff: float) -> int:
        tmp_dir = self.root / TMP_DIR
        if not tmp_dir.is_dir():
            return 0
        return sum(_unlink(path) for path in tmp_dir.iterdir() if _older(path, cutoff))


def _chunks(data: bytes | BinaryIO, chunk_size: int) -> Iterator[bytes]:
    """Yield ``data`` in chunks, reading a stream piece by piece."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for start in range(0, len(view), chunk_size):
            yield view[start : start + chunk_size]
        return
    if not hasattr(data, "read"):
        raise TypeError(f"expected bytes or a binary stream, got {type(data).__name__}")
    while chunk := data.read(chunk_size):
        if isinstance(chunk, str):
            raise TypeError("expected a binary stream, got a text stream")
        yield chunk


def _copy_hashing(chunks: Iterator[bytes], out: BinaryIO) -> StoredPayload:
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        out.write(chunk)
        size += len(chunk)
    return StoredPayload(digest.hexdigest(), size)


def _same_size(path: Path, size: int) -> bool:
    """True if ``path`` exists with ``size`` bytes; a truncated copy gets replaced."""
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False


def _fsync_dir(path: Path) -> None:
    """Make a rename durable: on POSIX the directory entry needs its own fsync."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _shards(path: Path) -> Iterator[Path]:
    """The shard directories of a level (two hex digits), skipping ``tmp`` and strays."""
    if not path.is_dir():
        return
    for entry in os.scandir(path):
        if entry.is_dir() and SHARD_RE.fullmatch(entry.name):
            yield Path(entry.path)


def _older(path: Path, cutoff: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1
