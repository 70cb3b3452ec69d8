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

A batch may take a file that is already on the store's file system by a hard link
instead of a copy (``PayloadBatch.put(stream, link=its name)``, the file poller's
intake): the name is linked into ``<root>/tmp``, the link checked to be the inode the
stream has open, and the bytes hashed by reading that inode; then it
goes the way of a copy (in place, durable, then the caller's transaction, then the
caller removes its own name). That spares a new file and a data write per payload. It
is taken only for a regular file with no other name (``st_nlink`` 1), so that once the
caller has removed its name nothing but the store reaches the inode; on any other file,
or when the link fails (another file system, no hard links, permission), the bytes
are copied as before. A process that dies before the commit
leaves the link in ``tmp``, which :meth:`PayloadStore.remove_stale_temp` removes like an
interrupted copy. A link keeps the file's old mtime, so the store sets its atime to the
time of the link (the mtime untouched, so the caller's checks of size and mtime still
hold) and the cleanups take a file's age from the later of the two.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import io
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

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
#: the lock file between a put that reuses a stored file and the orphan cleanup
LOCK_FILE = "store.lock"
_T = TypeVar("_T")
#: seconds after which a file in ``tmp`` is taken for the leftover of a dead process
TEMP_GRACE = 24 * 3600


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

    #: whether :meth:`read_ahead` fetches anything (an open here is a local file's)
    reads_ahead = False

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
        fd, tmp_name = self._in_tmp(lambda tmp_dir: tempfile.mkstemp(dir=tmp_dir,
                                                                     prefix="put-"))
        try:
            with open(fd, "wb", closefd=False) as out:
                stored = _copy_hashing(_chunks(data, chunk_size), out)
        except BaseException:
            os.close(fd)
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return fd, Path(tmp_name), stored

    def _in_tmp(self, make: Callable[[Path], _T]) -> _T:
        """``make(tmp directory)``, creating the directory only when it is missing (a
        mkdir per payload cost more than the rest of a small payload's bookkeeping)."""
        tmp_dir = self.root / TMP_DIR
        try:
            return make(tmp_dir)
        except FileNotFoundError:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            return make(tmp_dir)

    def _link_temp(self, data: BinaryIO, name: str | Path, chunk_size: int
                   ) -> tuple[int, Path, StoredPayload] | None:
        """Hard-link the file ``name`` into ``tmp``, check that the link is the very
        file ``data`` has open, and hash it there; the link's descriptor, path and
        digest, or None (nothing left behind) where a copy must do (see the module
        docstring)."""
        try:
            fd = os.dup(data.fileno())
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            return None
        tmp = None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                raise _NoLink
            tmp = self.root / TMP_DIR / f"link-{secrets.token_hex(8)}"
            try:
                self._in_tmp(lambda _tmp_dir: os.link(name, tmp, follow_symlinks=False))
            except OSError as exc:
                tmp = None
                raise _NoLink from exc
            linked = tmp.stat()
            # The name may point at another file by now; and no other name may have
            # appeared (one that could still change the stored bytes).
            if ((linked.st_dev, linked.st_ino) != (info.st_dev, info.st_ino)
                    or linked.st_nlink != 2):
                raise _NoLink
            try:
                _touch_atime(fd)  # its age for the cleanups starts now; mtime stays
            except PermissionError as exc:
                raise _NoLink from exc
            # Nothing of the stream was read before this point, so a copy can still
            # take over above; a failure from here on is the read's own.
            stored = _copy_hashing(_chunks(data, chunk_size), None)
        except BaseException as exc:
            os.close(fd)
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            if isinstance(exc, _NoLink):
                return None
            raise
        return fd, tmp, stored

    def _place(self, tmp: Path, stored: StoredPayload, sync_dir: bool = True) -> Path | None:
        """Move a written temp file to its place, or drop it if the content is there;
        the directory that got a new name (fsynced unless ``sync_dir`` is off)."""
        final = self.path(stored.digest)
        if final.exists() and self._reuse(final, stored):
            tmp.unlink()
            return None
        try:
            os.replace(tmp, final)
        except FileNotFoundError:  # its shard directories are new (or tmp is gone)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
        if sync_dir:
            _fsync_dir(final.parent)
        return final.parent

    def _reuse(self, final: Path, stored: StoredPayload) -> bool:
        """Whether the file in place holds the content; if so its age is refreshed, so
        the orphan cleanup gives the new reference its grace period. Under the shared
        lock: a removal (exclusive) is either done before (no file) or sees it young."""
        with self._lock(fcntl.LOCK_SH):
            if not _holds(final, stored):
                return False
            os.utime(final)
            return True

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

    def read_ahead(self, wanted: dict[str, int]) -> dict[str, bytes]:
        """Nothing: opening a file on a local disk costs no round trip to save."""
        return {}

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        """The size in bytes of a stored payload."""
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            raise PayloadMissing(digest) from None

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

    def older_than(self, digest: str, seconds: float) -> bool:
        """Whether the file of ``digest`` was written and taken in longer ago than
        ``seconds`` (False when there is none)."""
        return _older(self.path(digest), time.time() - seconds)

    def walk(self) -> Iterator[tuple[str, int, float]]:
        """(digest, size, age in seconds) of every stored file, in no particular order;
        the age counts from the later of the write and the taking in."""
        now = time.time()
        for digest, path in self._iter_files():
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            yield digest, info.st_size, now - max(info.st_mtime, info.st_atime)

    def remove_unreferenced(self, digest: str, is_referenced: Callable[[str], bool],
                            cutoff: float) -> int | None:
        """Remove the file of ``digest`` if it is older than ``cutoff`` (a time.time())
        and not referenced; its size in bytes, or None when it stays.

        Never removes a file a put of the same content is reusing: a put that finds the
        file already there checks it and refreshes its age under a shared lock of the
        store (:meth:`_place`), and the age is checked again and the file removed under
        the exclusive one, so a put either refreshed the age first (the file stays) or
        finds no file and places its own copy. A transaction must commit within the
        grace period of storing its payloads (the age a file must reach before it may
        go), which an hour leaves to spare.
        """
        path = self.path(digest)
        if not _older(path, cutoff) or is_referenced(digest):
            return None
        with self._lock(fcntl.LOCK_EX):
            if not _older(path, cutoff):
                return None
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                return None
        return size

    @contextlib.contextmanager
    def _lock(self, kind: int) -> Iterator[None]:
        """The store's lock between a put reusing a file and a removal (a file of its
        own, so a lock of one process never passes for another's)."""
        try:
            fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, kind)
            yield
        finally:
            os.close(fd)  # releases the lock

    def remove_stale_temp(self, older_than_seconds: float = TEMP_GRACE) -> int:
        """Remove the files in ``tmp`` older than ``older_than_seconds``: copies and
        links of batches whose process died before putting them in place. A batch
        still under way whose file is removed this way fails its commit (the file is
        not found when it is moved into place), stores nothing, and its files are
        taken again; nothing is lost. Returns how many files went."""
        return self._remove_old_temp_files(time.time() - older_than_seconds)

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

    def put(self, data: bytes | BinaryIO, chunk_size: int = 1 << 20,
            link: str | Path | None = None) -> StoredPayload:
        """Write ``data`` (read in chunks, never whole) to a temp file of the batch.
        With ``link``, the name of the open file ``data``, a regular file with no other
        name on the store's file system is hard-linked into the batch instead of
        copied (module docstring); its caller removes its own name after the commit, as
        it would after a copy."""
        written = (self.store._link_temp(data, link, chunk_size) if link else None) \
            or self.store._write_temp(data, chunk_size)
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


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_UTIME_NOW, _UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2


def _load_libc(name: str, argtypes: list):
    """libc's function ``name`` (Linux) returning an int, or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


_SYNCFS = _load_libc("syncfs", [ctypes.c_int])
_FUTIMENS = _load_libc("futimens", [ctypes.c_int, ctypes.POINTER(_Timespec * 2)])


def _touch_atime(fd: int) -> None:
    """Set the atime of ``fd`` to now and leave its mtime exactly as it is (futimens
    with UTIME_OMIT: reading the mtime and writing it back could undo a write made in
    between). PermissionError where this is not allowed or not available."""
    if _FUTIMENS is None:
        raise PermissionError(errno.ENOSYS, "futimens is not available")
    times = (_Timespec * 2)(_Timespec(0, _UTIME_NOW), _Timespec(0, _UTIME_OMIT))
    if _FUTIMENS(fd, ctypes.byref(times)) != 0:
        err = ctypes.get_errno()
        raise PermissionError(err, f"futimens: {os.strerror(err)}")


def syncfs(fd: int) -> bool:
    """Make everything written to the file system of ``fd`` durable in one call (one
    journal commit instead of one per file); False where the system has no syncfs."""
    if _SYNCFS is None:
        return False
    if _SYNCFS(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")
    return True


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


def _copy_hashing(chunks: Iterator[bytes], out: BinaryIO | None) -> StoredPayload:
    """Hash the chunks (and write them to ``out`` unless it is None)."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        if out is not None:
            out.write(chunk)
        size += len(chunk)
    return StoredPayload(digest.hexdigest(), size)


class _NoLink(Exception):
    """The file cannot be taken by a hard link: copy it instead."""


def _holds(path: Path, stored: StoredPayload) -> bool:
    """True if ``path`` holds exactly the stored content (size, then sha256, read in
    chunks); a short, corrupt or never-synced copy gets replaced."""
    try:
        with open(path, "rb") as file:
            return (os.fstat(file.fileno()).st_size == stored.size
                    and _copy_hashing(_chunks(file, READ_CHUNK), None) == stored)
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
    """Written (mtime) and taken in (atime, set when a hard link brought it in; a read
    may move it later, never earlier) before ``cutoff``."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return False
    return max(info.st_mtime, info.st_atime) < cutoff


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1
