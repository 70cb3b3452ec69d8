"""The content-addressed payload store on the filesystem (SPEC 11).

A payload is stored once under its sha256: ``<root>/<d[0:2]>/<d[2:4]>/<digest>``. It is
written to ``<root>/tmp`` first, made durable and renamed into place (the rename made
durable too), so a reader never sees half a file, and it is written *before* the
transaction that references it; the nightly cleanup therefore only removes unreferenced
files older than a grace period. :meth:`PayloadStore.batch` stores many payloads with
their durability paid once per batch: where the system has ``syncfs``, all are renamed
into place and then one ``syncfs`` of the store's file system makes the data and the
new names durable together; elsewhere all data is fsynced, then renamed, then each
directory fsynced. Reads check the sha256 at the end of the stream, so silent
corruption on disk is never handed on as a good payload.

With one ``syncfs`` a crash between the rename and the sync can leave a file under its
digest whose bytes never reached the disk (empty, short, or zeros). No row refers to it
(the rows commit only after the sync), reads would report it corrupt, and storing the
same content again never trusts it: a file already under the digest is kept only when
its bytes hash to the digest, else it is replaced. Plain Python: no Flask, no Celery,
no SQLAlchemy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
    "PayloadBatch",
    "PayloadMissing",
    "PayloadStore",
    "StoredPayload",
    "VerifiedReader",
    "syncfs",
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
        fd, tmp, stored = self._write_temp(data, chunk_size)
        try:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._place(tmp, stored)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return stored

    def batch(self) -> PayloadBatch:
        """A batch of payloads made durable together (see :class:`PayloadBatch`)."""
        return PayloadBatch(self)

    def _write_temp(self, data: bytes | BinaryIO, chunk_size: int
                    ) -> tuple[int, Path, StoredPayload]:
        """Write ``data`` to a new temp file; its open descriptor, path and digest."""
        tmp_dir = self.root / TMP_DIR
        try:  # the directory is made once, not checked at every write
            fd, tmp_name = tempfile.mkstemp(dir=tmp_dir, prefix="put-")
        except FileNotFoundError:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=tmp_dir, prefix="put-")
        try:
            with open(fd, "wb", closefd=False) as out:
                stored = _copy_hashing(_chunks(data, chunk_size), out)
        except BaseException:
            os.close(fd)
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return fd, Path(tmp_name), stored

    def _place(self, tmp: Path, stored: StoredPayload, sync_dir: bool = True) -> Path | None:
        """Move a written temp file to its place, or drop it if the content is there;
        the directory that got a new name (fsynced unless ``sync_dir`` is off)."""
        final = self.path(stored.digest)
        if _holds(final, stored):
            tmp.unlink()
            # Refresh the age so the orphan cleanup gives the new reference its grace period.
            os.utime(final)
            return None
        try:  # the directory is made when a name first needs it, not checked every time
            os.replace(tmp, final)
        except FileNotFoundError:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
        if sync_dir:
            _fsync_dir(final.parent)
        return final.parent

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


class PayloadBatch:
    """Payloads stored together: :meth:`put` writes each to a temp file and returns its
    digest; :meth:`commit` makes them all durable and puts them in place, in that order,
    paying durability once for the batch. Nothing is in place before :meth:`commit`;
    :meth:`discard` (or a process that dies) leaves only temp files, which the orphan
    cleanup removes. Use the digests in a transaction only after :meth:`commit`."""

    def __init__(self, store: PayloadStore):
        self.store = store
        self._written: list[tuple[int, Path, StoredPayload]] = []

    def __len__(self) -> int:
        return len(self._written)

    def put(self, data: bytes | BinaryIO, chunk_size: int = 1 << 20) -> StoredPayload:
        """Write ``data`` (read in chunks, never whole) to a temp file of the batch."""
        written = self.store._write_temp(data, chunk_size)
        self._written.append(written)
        return written[2]

    def drop(self, stored: StoredPayload) -> None:
        """Forget a payload :meth:`put` returned (its file is not wanted after all)."""
        keep = []
        for written in self._written:
            if written[2] is stored:
                _remove_temp(written)
            else:
                keep.append(written)
        self._written = keep

    def commit(self) -> None:
        """Every payload in place and durable: renamed, then one ``syncfs`` for the data
        and the names together (see the module docstring); without ``syncfs``, data
        fsynced, then renamed, then the directories fsynced."""
        written, self._written = self._written, []
        if not written:
            return
        if _SYNCFS is not None:
            self._place_then_sync(written)
            return
        try:
            if not syncfs(written[0][0]):
                for fd, _tmp, _stored in written:
                    os.fsync(fd)
        except BaseException:
            for item in written:
                _remove_temp(item)
            raise
        for fd, _tmp, _stored in written:
            os.close(fd)
        dirs: set[Path] = set()
        try:
            for _fd, tmp, stored in written:
                placed = self.store._place(tmp, stored, sync_dir=False)
                if placed is not None:
                    dirs.update((placed, placed.parent))
        finally:
            for _fd, tmp, _stored in written:
                tmp.unlink(missing_ok=True)
        if dirs and not _syncfs_path(self.store.root):
            for path in sorted(dirs):
                _fsync_dir(path)

    def _place_then_sync(self, written: list[tuple[int, Path, StoredPayload]]) -> None:
        try:
            for _fd, tmp, stored in written:
                self.store._place(tmp, stored, sync_dir=False)
            # the descriptor of a temp file still open: the file system to sync
            syncfs(written[0][0])
        finally:
            for item in written:
                _remove_temp(item)  # closes it; the temp name is gone once placed

    def discard(self) -> None:
        """Remove the temp files of payloads not committed."""
        written, self._written = self._written, []
        for item in written:
            _remove_temp(item)


def _remove_temp(written: tuple[int, Path, StoredPayload]) -> None:
    fd, tmp, _stored = written
    try:
        os.close(fd)
    except OSError:
        pass
    tmp.unlink(missing_ok=True)


def _load_syncfs():
    """libc's ``syncfs`` (Linux), or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_SYNCFS = _load_syncfs()


def syncfs(fd: int) -> bool:
    """Make everything written to the file system of ``fd`` durable in one call (one
    journal commit instead of one per file); False where the system has no syncfs."""
    if _SYNCFS is None:
        return False
    if _SYNCFS(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")
    return True


def _syncfs_path(path: Path) -> bool:
    if _SYNCFS is None:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return syncfs(fd)
    finally:
        os.close(fd)


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


def _holds(path: Path, stored: StoredPayload) -> bool:
    """True if ``path`` holds exactly the stored content (size, then sha256, read in
    chunks); a short, corrupt or never-synced copy gets replaced."""
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size != stored.size:
                return False
            digest = hashlib.sha256()
            while chunk := file.read(READ_CHUNK):
                digest.update(chunk)
    except FileNotFoundError:
        return False
    return digest.hexdigest() == stored.digest


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
