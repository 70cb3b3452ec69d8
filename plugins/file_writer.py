"""The ``file_writer`` target: writes a message's payload stage to a file (SPEC 9).

The file's path below ``base_directory`` comes from ``filename_pattern``
(:mod:`b2bhub.domain.filename_pattern`). A write that cannot succeed fails the delivery
at once: the message lacks the ``payload_stage``, the pattern gives no name for it, the
file exists and ``overwrite`` is off, or the path would lead out of the base directory.
Any other failure (permission, disk full, read-only file system...) is an error of class
``storage`` that the retry policy retries: 30 s, 2 min and 10 min, then failed.

The write is atomic and streamed: the payload is copied in chunks to a temporary file in
the target directory. The writes of a claimed batch are made durable together, before
their outcomes are recorded (:meth:`FileWriter.before_settle`): first their data (one
``syncfs`` per file system, or an fsync per file where the system has no syncfs), then
each temporary file is moved into place with ``os.replace`` (overwrite on) or
``os.link`` (overwrite off: the link fails if the name was taken meanwhile, so no file
is ever clobbered), then each directory written into is fsynced once. A file therefore
appears under its name only with all its bytes durable, and a write is never recorded
as delivered before its name is durable; a write whose data or directory cannot be made
durable is a storage error (retried). A re-attempt that finds the file already holding
exactly the payload (same size, same sha256) counts as written, so an attempt cut short
after the move does not fail its retry.

A worker killed between a write and its move leaves the hidden temporary file
(``.b2bhub-<16 hex digits>.tmp``) behind. The first write into a directory in an hour
(per process) removes the files of exactly that naming there that are older than
``STALE_TEMP_SECONDS`` (an hour): a temporary file lives from its write to the end of
its claimed batch, seconds, so one that old belongs to no attempt still under way;
were one nonetheless removed under a live attempt, that attempt's move would fail as a
storage error and be retried, never recorded as delivered.

Directories are walked one element at a time with directory descriptors, and each one's
resolved path must lie below the resolved base directory, so a symbolic link can never
lead a write out of it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from b2bhub.plugin import (
    FILE_WRITER_DEFAULT,
    N_,
    DeliveryInfo,
    Outcome,
    OutcomeKind,
    PayloadError,
    PayloadReader,
    Plugin,
    TargetContext,
    filename_pattern,
    syncfs,
)
from b2bhub.plugin.schema import Field

FilenamePattern = filename_pattern.FilenamePattern
PatternError = filename_pattern.PatternError
parse = filename_pattern.parse
placeholder_values = filename_pattern.placeholder_values

DEFAULT_PATTERN = "{original_filename|message_id}"
STAGES = ("raw", "unpacked", "sent")
CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# linkat errors meaning "this file system has no hard links", not "the name is taken"
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK}
_TEMP_NAME = re.compile(r"\.b2bhub-[0-9a-f]{16}\.tmp")
#: age after which a temporary file of this naming is a leftover (module docstring)
STALE_TEMP_SECONDS = 3600.0
#: seconds between two looks for leftovers in one directory, per process
STALE_TEMP_CHECK_SECONDS = 3600.0


def _absolute_problem(value: str) -> str | None:
    return None if os.path.isabs(value) else N_("must be an absolute path")


class OutsideBase(Exception):
    """The path would lead out of the base directory (through a symbolic link)."""


@dataclass
class _Staged:
    """A write of the current batch that is not in place yet: its temporary file beside
    its destination, and what its outcome becomes once it is."""

    directory: tuple[int, int]  # (st_dev, st_ino), a key of FileWriter._dirs
    tmp: str
    name: str
    relative: str
    payload: PayloadReader
    reattempt: bool
    outcome: Outcome  # the one deliver returned


class FileWriter(Plugin):
    """Writes the chosen payload stage of each message to a file below a directory."""

    type_name = "file_writer"
    roles = frozenset({"target"})
    description = "Writes each message to a file below a directory."
    default_retry_policy = FILE_WRITER_DEFAULT
    claim_batch = 16
    config_schema = [
        Field("base_directory", "path", label="Base directory",
              required=True, validate=_absolute_problem,
              help="absolute directory below which files are written; created if missing"),
        Field("filename_pattern", "string", label="File name pattern", default=DEFAULT_PATTERN,
              validate=filename_pattern.problem,
              help="file name below the base directory, e.g. {to}/{original_filename}; "
                   "{a|b} takes the first with a value; / makes subdirectories"),
        Field("overwrite", "boolean", label="Overwrite an existing file", default=False,
              help="replace a file of the same name; when off such a message fails"),
        Field("payload_stage", "choice", label="Payload stage", default="unpacked", choices=STAGES,
              help="which recorded stage of the message is written"),
    ]

    def __init__(self, instance_name: str, config: dict[str, Any]):
        super().__init__(instance_name, config)
        self.base = config["base_directory"]
        self.overwrite = bool(config.get("overwrite"))
        self.stage = config.get("payload_stage") or "unpacked"
        try:
            self.pattern: FilenamePattern | None = parse(
                config.get("filename_pattern") or DEFAULT_PATTERN)
            self.pattern_problem = ""
        except PatternError as exc:  # saved before a rule existed: fail, do not crash
            self.pattern, self.pattern_problem = None, str(exc)
        # directories written into since the last before_settle: (dev, inode) -> fd
        self._dirs: dict[tuple[int, int], int] = {}
        # writes waiting for before_settle to make them durable and put them in place
        self._staged: list[_Staged] = []
        # directories looked at for leftover temporary files: (dev, inode) -> monotonic
        self._swept: dict[tuple[int, int], float] = {}

    def deliver(self, delivery: DeliveryInfo, payload: PayloadReader,
                context: TargetContext) -> Outcome:
        """Write the payload stage to its file; see the module docstring."""
        if self.stage not in payload.stages():
            return Outcome.failed(f"the message has no '{self.stage}' payload stage")
        try:
            relative = self._relative_path(delivery)
        except PatternError as exc:
            return Outcome.failed(f"the filename pattern fails: {exc}")
        try:
            return self._write(relative, payload, reattempt=delivery.attempt > 1)
        except OutsideBase as exc:
            return Outcome.failed(str(exc), file=relative)
        except PayloadError as exc:
            return Outcome.error("payload", f"could not read the payload: {exc}")
        except OSError as exc:
            return Outcome.error("storage", f"could not write {relative} below {self.base}: "
                                 f"{_reason(exc)}",
                                 file=relative)

    def _relative_path(self, delivery: DeliveryInfo) -> str:
        if self.pattern is None:
            raise PatternError(self.pattern_problem)
        return self.pattern.render(placeholder_values(
            message_id=delivery.message_id, delivery_id=delivery.delivery_id,
            from_party=delivery.from_party, to_party=delivery.to_party,
            source=delivery.source, target=delivery.target,
            original_filename=delivery.original_filename, external_id=delivery.external_id,
            correlation_id=delivery.correlation_id, created_at=delivery.created_at,
            attempt=delivery.attempt))

    def _write(self, relative: str, payload: PayloadReader, reattempt: bool) -> Outcome:
        """Write the temporary file; :meth:`before_settle` puts it in place."""
        *dirs, name = relative.split("/")
        with _directory(self.base, dirs) as dir_fd:
            found = _lstat(dir_fd, name)
            if found is not None and not self.overwrite:
                return self._taken(dir_fd, name, relative, payload, reattempt)
            directory = self._keep_dir(dir_fd)
            tmp, size = _write_temp(dir_fd, payload, self.stage)
        outcome = Outcome.delivered(f"wrote {relative} ({size} bytes)", file=relative,
                                    size=size)
        self._staged.append(_Staged(directory, tmp, name, relative, payload, reattempt,
                                    outcome))
        return outcome

    def _keep_dir(self, dir_fd: int) -> tuple[int, int]:
        """Keep a descriptor of this directory until :meth:`before_settle`; its key."""
        info = os.fstat(dir_fd)
        key = (info.st_dev, info.st_ino)
        if key not in self._dirs:
            self._dirs[key] = os.dup(dir_fd)
            self._sweep(dir_fd, key)
        return key

    def _sweep(self, dir_fd: int, key: tuple[int, int]) -> None:
        """Remove this directory's leftover temporary files, at most once per
        ``STALE_TEMP_CHECK_SECONDS`` per process (module docstring)."""
        last = self._swept.get(key)
        if last is not None and time.monotonic() - last < STALE_TEMP_CHECK_SECONDS:
            return
        self._swept[key] = time.monotonic()
        remove_stale_temp_files(dir_fd)

    def before_settle(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Make the writes these outcomes report durable and put them in place: their
        data first, then the moves, then each directory's new names (see the module
        docstring). A write that cannot be made durable becomes a storage error (the
        retry finds a file already in place holding its payload and counts it as
        written); a name taken meanwhile fails it as at the start of the attempt. A
        temporary file whose attempt reported nothing (cancelled) is removed."""
        staged, self._staged = self._staged, []
        try:
            mine = {id(s.outcome): s for s in staged}
            results = list(outcomes)
            ours = [i for i, outcome in enumerate(outcomes) if id(outcome) in mine
                    and mine[id(outcome)].outcome is outcome]
            problem = self._sync_data([mine[id(outcomes[i])] for i in ours])
            for i in ours:
                results[i] = (self._durability_error(outcomes[i], problem) if problem
                              else self._put_in_place(mine[id(outcomes[i])]))
            problem = self._sync_dirs()
        finally:
            for item in staged:  # the temporary files not moved into place
                _unlink_quietly(self._dirs[item.directory], item.tmp)
            dirs, self._dirs = self._dirs, {}
            for fd in dirs.values():
                os.close(fd)
        if problem is None:
            return results
        return [self._durability_error(outcome, problem) for outcome in results]

    def _sync_data(self, staged: list[_Staged]) -> OSError | None:
        """The data of these temporary files durable: one syncfs per file system they
        are on, else an fsync of each."""
        try:
            done: set[int] = set()
            for item in staged:
                device = item.directory[0]
                if device in done:
                    continue
                if not syncfs(self._dirs[item.directory]):
                    break
                done.add(device)
            else:
                return None
            for item in staged:
                fd = os.open(item.tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=self._dirs[item.directory])
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            return exc
        return None

    def _put_in_place(self, item: _Staged) -> Outcome:
        """Move a durable temporary file to its name; the outcome to record."""
        dir_fd = self._dirs[item.directory]
        try:
            try:
                placed = self._place(dir_fd, item.tmp, item.name)
            finally:
                _unlink_quietly(dir_fd, item.tmp)
            if not placed:
                return self._taken(dir_fd, item.name, item.relative, item.payload,
                                   item.reattempt)
        except PayloadError as exc:
            return Outcome.error("payload", f"could not read the payload: {exc}")
        except OSError as exc:
            return Outcome.error("storage", f"could not write {item.relative} below "
                                 f"{self.base}: {_reason(exc)}", file=item.relative)
        return item.outcome

    def _sync_dirs(self) -> OSError | None:
        """Fsync each directory written into since the last call, once."""
        failure = None
        for fd in self._dirs.values():
            try:
                os.fsync(fd)
            except OSError as exc:
                failure = exc
        return failure

    def _durability_error(self, outcome: Outcome, failure: OSError) -> Outcome:
        if outcome.kind != OutcomeKind.DELIVERED:
            return outcome
        return Outcome.error("storage", f"could not make the write durable below "
                             f"{self.base}: {_reason(failure)}", **outcome.data)

    def _place(self, dir_fd: int, tmp: str, name: str) -> bool:
        """Move the written temp file to ``name``; False if overwrite is off and the
        name is taken."""
        if self.overwrite:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return True
        try:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS or _lstat(dir_fd, name) is not None:
                raise
            # No hard links here: check-then-rename, with a window only such file
            # systems have.
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True

    def _taken(self, dir_fd: int, name: str, relative: str, payload: PayloadReader,
               reattempt: bool) -> Outcome:
        """The name exists and overwrite is off: written already, or failed."""
        if reattempt and _holds(dir_fd, name, payload, self.stage):
            self._keep_dir(dir_fd)  # fsynced before the settlement: the attempt that
            # wrote it may not have
            size = payload.size(self.stage)
            return Outcome.delivered(
                f"{relative} already holds this payload ({size} bytes); counted as written",
                file=relative, size=size)
        return Outcome.failed(f"{relative} exists and overwrite is off", file=relative)


@contextmanager
def _directory(base: str, dirs: list[str]) -> Iterator[int]:
    """A descriptor of ``base/dirs...``, each created if missing and checked to lie
    below the resolved base directory."""
    os.makedirs(base, exist_ok=True)
    fd = os.open(base, _DIR_FLAGS)
    try:
        root = _resolved(fd, base)
        for depth, name in enumerate(dirs, 1):
            child = _open_child(fd, name, root, "/".join(dirs[:depth]))
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_child(parent: int, name: str, root: str, shown: str) -> int:
    """Open directory ``name`` of ``parent``, creating it if needed; OutsideBase if it
    resolves outside ``root``."""
    try:
        os.mkdir(name, dir_fd=parent)
        os.fsync(parent)  # make the new entry durable
    except FileExistsError:
        pass
    child = os.open(name, _DIR_FLAGS, dir_fd=parent)
    real = _resolved(child, os.path.join(root, shown))
    if os.path.commonpath([root, real]) != root:
        os.close(child)
        raise OutsideBase(f"{shown} leads out of the base directory (to {real})")
    return child


def _resolved(fd: int, fallback: str) -> str:
    """The real path of an open directory (what the descriptor is, not what a name
    may point to by now); the resolved name where /proc is missing."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(fallback)


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_temp(dir_fd: int, payload: PayloadReader, stage: str) -> tuple[str, int]:
    """Stream the stage into a new hidden temp file beside its destination (made durable
    later, with the rest of the batch)."""
    tmp = f".b2bhub-{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666, dir_fd=dir_fd)
    try:
        size = _copy(payload, stage, fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(dir_fd, tmp)
        raise
    os.close(fd)
    return tmp, size


def remove_stale_temp_files(dir_fd: int, older_than: float = STALE_TEMP_SECONDS) -> int:
    """Remove the regular files named as this writer names its temporary files that
    were last written ``older_than`` seconds ago or more; how many went. Anything else
    in the directory is left alone, and a failure only means another try later."""
    cutoff = time.time() - older_than
    removed = 0
    try:
        with os.scandir(dir_fd) as entries:
            stale = [entry.name for entry in entries if _TEMP_NAME.fullmatch(entry.name)
                     and _written_before(entry, cutoff)]
        for name in stale:
            os.unlink(name, dir_fd=dir_fd)
            removed += 1
    except OSError:
        pass
    return removed


def _written_before(entry: os.DirEntry, cutoff: float) -> bool:
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff


def _copy(payload: PayloadReader, stage: str, fd: int) -> int:
    """Copy the stage to ``fd`` through one reused buffer; the reader checks the
    sha256 at its end."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    size = 0
    with payload.open(stage) as stream:
        while count := stream.readinto(buffer):
            written = 0
            while written < count:
                written += os.write(fd, view[written:count])
            size += count
    return size


def _holds(dir_fd: int, name: str, payload: PayloadReader, stage: str) -> bool:
    """True if ``name`` is a regular file with exactly the stage's bytes (size first,
    then sha256 read in chunks)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symbolic link, a socket
            return False
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != payload.size(stage):
            return False
        return _sha256(fd) == _digest(payload, stage)
    finally:
        os.close(fd)


def _sha256(fd: int) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while count := os.readv(fd, [buffer]):
        digest.update(view[:count])
    return digest.hexdigest()


def _digest(payload: PayloadReader, stage: str) -> str:
    """The stage's recorded sha256, or one computed by reading it (a reader without
    ``digest``)."""
    recorded = getattr(payload, "digest", None)
    if recorded is not None:
        return recorded(stage)
    digest = hashlib.sha256()
    with payload.open(stage) as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
