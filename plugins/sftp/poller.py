"""The ``sftp_poller`` source: makes a message of each file that appears below a
directory on an SFTP server (docs/sftp.md, "The poller").

It logs in as :mod:`.connection` describes (pinned host key required; a changed key is
refused before any credential is sent), one connection per worker process and instance
(:data:`.connection.POOL`), and every ``polling_interval`` seconds lists
``remote_directory`` exactly as deep as its path pattern, as ``file_poller`` walks its
base directory: ``path_pattern`` can name the parties with ``{from}``/``{to}``,
``file_pattern`` is a glob on the name, ``correlation_pattern`` captures an id, a file
whose parties cannot be resolved is moved to ``unroutable/`` with its reason beside it,
and symbolic links are never followed.

A file is taken once two listings agree on its size and mtime: the previous scan's in
this process, or, for a file this process has not seen yet, a second listing
``settle_seconds`` later in the same scan (scans of one instance may run in any worker).
At most ``max_files`` files are taken per scan.

Each file is streamed into the payload store (bounded read-ahead: memory does not grow
with the file) through ``SourceContext.take_file``; its message commits together with a
pickup row (path, size, mtime, sha256). Only then is the file handled as ``after``
says: ``delete``, ``move`` (renamed to ``archive_directory``/``archive_name``, never
over a file: ``.1``, ``.2``... are added) or ``keep``. This is the crash-safety method:
**record with the commit, remove after** (b2bhub.engine.intake). A process killed while
reading leaves the file in place and nothing committed: the next scan takes it. One
killed after the commit leaves the row: the next scan finds the same file (size, mtime,
content) and only removes or moves it. Renaming to claim a file before reading it was
not chosen: it makes the file vanish from the sender's view before the hub holds it,
and a claim left by a dead process needs its own recovery and timeout.

``keep`` leaves the file in place and keeps its pickup row as the memory that it was
taken (path, size, mtime: a file rewritten in place is a new file). The memory is
bounded by the listing: a row whose file is gone or changed is forgotten at the next
scan (``recover_files``), so it never holds more rows than files in the directory.

A failed listing or a connection lost in the middle of a scan is a collection error
(``SourceContext.record_collection_error``: one message and one ``message_failed``
alert per outage, resolved when a listing succeeds again); no message is made of a file
not read whole. The probe connects and stats the directory (Offline on the instances
page while it fails).
"""

from __future__ import annotations

import logging
import posixpath
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import IO, Any

import paramiko
from paramiko.message import Message
from paramiko.sftp import CMD_READ, CMD_STATUS, int64

from b2bhub.plugin import FileChanged, Plugin, RetryPolicy, RetryRule, SourceContext, Strategy
from b2bhub.plugin.schema import Field
from plugins.file_poller import (
    UNROUTABLE,
    FilePoller,
    LogOnce,
    Unroutable,
    _parse,
    _pattern_problem,
    correlation_of,
)
from plugins.sftp.actions import HostKeyActions
from plugins.sftp.connection import (
    CONNECTION_FIELDS,
    POOL,
    Connection,
    Endpoint,
    SftpError,
    classify,
    probe_directory,
)

log = logging.getLogger(__name__)
#: the file poller's fields that mean the same here
FILE_FIELDS = {field.name: field for field in FilePoller.config_schema}
AFTER = ("delete", "move", "keep")
Parts = tuple[str, ...]
#: bytes per read request, and how many requests run ahead of the reader (bounds memory)
READ_REQUEST = 1 << 16
READ_AHEAD = 16
NS = 1_000_000_000


def _absolute_problem(value: str | None) -> str | None:
    if not value:
        return None
    return None if value.startswith("/") else "must be an absolute path on the server"


def _archive_name_problem(value: str | None) -> str | None:
    if not value:
        return None
    try:
        value.format(path="p", filename="f", timestamp="t")
    except (KeyError, IndexError, ValueError) as exc:
        return f"may hold only {{path}}, {{filename}} and {{timestamp}} ({exc})"
    if value.startswith("/") or ".." in value.split("/"):
        return "is relative to the archive directory and may not hold .."
    return None


class SftpPoller(HostKeyActions, Plugin):
    """Takes the files that appear below a directory on an SFTP server."""

    type_name = "sftp_poller"
    roles = frozenset({"source"})
    #: a server away for a minute or two (a restart) records nothing: three more tries
    #: (15, 30, 60 s, or the next scan when sooner), then the Collection error; a
    #: changed host key is recorded at once (docs/sftp.md "Outages")
    collection_retry_policy = RetryPolicy(
        strategy=Strategy.EXPONENTIAL, base_delay=15, max_delay=60, max_attempts=4,
        rules=(RetryRule("host_key", "fail"),))
    description = ("Makes a message of each file that appears below a directory on an "
                   "SFTP server (pinned host key), then deletes, moves or keeps it.")
    config_schema = [
        *CONNECTION_FIELDS,
        Field("remote_directory", "string", label="Remote directory", required=True,
              validate=_absolute_problem,
              help="absolute directory on the server whose files are taken"),
        Field("polling_interval", "integer", label="Polling interval (seconds)",
              default=60, min=1, max=86400, help="seconds between two scans"),
        # at most 20: the scan waits that long holding its lease (30 s by default)
        Field("settle_seconds", "integer", label="Settle time (seconds)", default=2,
              min=0, max=20,
              help="a file not seen by this process's previous scan is listed again "
                   "after so many seconds and taken if its size and mtime did not change"),
        Field("max_files", "integer", label="Files per scan", default=100, min=1,
              max=100000, help="at most so many files are taken by one scan"),
        Field("path_pattern", "string", label="Path pattern",
              default="{filename}", validate=_pattern_problem,
              help="where files are, relative to the remote directory: elements "
                   "separated by /, each literal text or one of {from}, {to}, {filename}"),
        *(FILE_FIELDS[name] for name in ("file_pattern", "from", "to",
                                         "correlation_pattern")),
        Field("after", "choice", label="After the message is stored", default="delete",
              choices=AFTER,
              help="delete: the file is removed; move: renamed into the archive "
                   "directory; keep: left in place and remembered, never taken twice"),
        Field("archive_directory", "string", label="Archive directory",
              validate=_absolute_problem,
              help="with move: absolute directory on the server, outside the remote "
                   "directory; made if missing"),
        Field("archive_name", "string", label="Archive name pattern", default="{path}",
              validate=_archive_name_problem,
              help="the file's name below the archive directory: {path} (its path "
                   "below the remote directory), {filename}, {timestamp} (UTC, "
                   "YYYYMMDDHHMMSS); a name already taken gets .1, .2, ..."),
    ]

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> dict[str, str]:
        found = Endpoint.from_config(config).problems()
        try:
            _parse(config)
        except ValueError as exc:
            found["path_pattern"] = exc.args[0]  # a Text: shown in the reader's language
        archive = (config.get("archive_directory") or "").rstrip("/")
        base = (config.get("remote_directory") or "").rstrip("/")
        if (config.get("after") or "delete") == "move":
            if not archive:
                found["archive_directory"] = "required to move files"
            elif base and (archive == base or archive.startswith(base + "/")):
                found["archive_directory"] = ("must be outside the remote directory (its "
                                              "files would be taken again)")
        return found

    def __init__(self, instance_name: str, config: dict[str, Any]):
        super().__init__(instance_name, config)
        self.endpoint = Endpoint.from_config(config)
        self.owner = f"instance:{instance_name}"
        self.base = (config.get("remote_directory") or "/").rstrip("/") or "/"
        self.pattern = _parse(config)
        self.file_pattern = config.get("file_pattern") or "*"
        self.correlation = (re.compile(config["correlation_pattern"])
                            if config.get("correlation_pattern") else None)
        self.after = config.get("after") or "delete"
        self.archive = (config.get("archive_directory") or "").rstrip("/") or None
        self.archive_name = config.get("archive_name") or "{path}"
        self.max_files = int(config.get("max_files") or 100)
        self.settle = float(config.get("settle_seconds") if config.get(
            "settle_seconds") is not None else 2)
        self._previous: dict[Parts, tuple[int, int]] = {}
        self._logged = LogOnce()

    # --- the scan ----------------------------------------------------------------------
    def poll(self, context: SourceContext) -> None:
        """Recover, list, take the complete files; a collection error when the server
        cannot be reached or the connection is lost."""
        for fresh in (False, True):
            try:
                with POOL.connection(self.owner, self.endpoint, fresh=fresh) as (
                        conn, reused):
                    try:
                        listing = self._list(conn)
                    except SftpError as exc:
                        if reused and not fresh and exc.error_class in (
                                "connection", "timeout"):
                            continue  # a kept connection the server dropped meanwhile
                        raise
                    context.collection_succeeded()
                    self._scan(context, conn, listing)
                    return
            except SftpError as exc:
                log.warning("%s: %s", self.instance_name, exc.text)
                from_party, to_party = self._error_parties(context)
                context.record_collection_error(
                    f"{exc.text} ({self.endpoint.where}, {self.base}; error class "
                    f"{exc.error_class})", from_party, to_party, error_class=exc.error_class)
                return

    def _scan(self, context: SourceContext, conn: Connection,
              listing: dict[Parts, tuple[int, int]]) -> None:
        context.recover_files(lambda relative: self._find(conn, listing, relative))
        taken = context.taken()
        fresh = {p: seen for p, seen in listing.items()
                 if (_relative(p), seen[0], seen[1]) not in taken}
        complete = [p for p, seen in fresh.items() if self._previous.get(p) == seen]
        if len(complete) < min(len(fresh), self.max_files) and self.settle:
            time.sleep(self.settle)
            again = self._list(conn)
            complete = [p for p, seen in fresh.items() if again.get(p) == seen]
            listing = again
        self._previous = listing
        for parts in sorted(complete)[:self.max_files]:
            self._pick_up(context, conn, parts, *listing[parts])
            if not conn.alive:
                raise SftpError("connection", "connection lost during the scan")
        context.flush()

    def _list(self, conn: Connection) -> dict[Parts, tuple[int, int]]:
        """Files at described places whose name matches: (size, mtime_ns) by path."""
        try:
            with conn.ops:
                return {parts: (attrs.st_size or 0, (attrs.st_mtime or 0) * NS)
                        for parts, attrs in self._walk(conn, ())
                        if fnmatchcase(parts[-1], self.file_pattern)}
        except SftpError:
            raise
        except Exception as exc:
            raise classify(exc, f"listing {self.base}") from None

    def _walk(self, conn: Connection, parts: Parts
              ) -> Iterator[tuple[Parts, paramiko.SFTPAttributes]]:
        level, last = len(parts), len(parts) == self.pattern.depth - 1
        literal = self.pattern.literal(level)
        try:
            entries = conn.sftp.listdir_attr(_join(self.base, parts))
        except OSError as exc:
            if not parts:
                raise
            self._note(parts, f"cannot be listed: {exc.strerror or exc}")
            return
        for attrs in sorted(entries, key=lambda a: a.filename):
            here, mode = parts + (attrs.filename,), attrs.st_mode or 0
            if level == 0 and attrs.filename == UNROUTABLE:
                continue
            if stat.S_ISLNK(mode):
                self._note(here, "is a symbolic link; not followed")
            elif literal is not None and attrs.filename != literal:
                self._note(here, "is at a place the path pattern does not describe")
            elif last and stat.S_ISREG(mode):
                yield here, attrs
            elif not last and stat.S_ISDIR(mode):
                yield from self._walk(conn, here)
            else:
                self._note(here, "is at a place the path pattern does not describe")

    def _note(self, parts: Parts, what: str) -> None:
        if self._logged.first(parts):
            log.warning("%s: %s %s; left alone", self.instance_name, _relative(parts), what)

    def _find(self, conn: Connection, listing: dict[Parts, tuple[int, int]],
              relative: str) -> RemoteFile | None:
        """The file now at a recorded path (recovery): from this scan's listing, which
        holds every file the pattern describes."""
        parts = tuple(relative.split("/"))
        seen = listing.get(parts)
        if seen is None:
            return None
        return self._file(conn, parts, *seen)

    def _file(self, conn: Connection, parts: Parts, size: int, mtime_ns: int
              ) -> RemoteFile:
        return RemoteFile(conn, self.base, parts, size, mtime_ns, self.after,
                          self._archive_path)

    # --- one file ----------------------------------------------------------------------
    def _pick_up(self, context: SourceContext, conn: Connection, parts: Parts,
                 size: int, mtime_ns: int) -> None:
        match = self.pattern.match(parts)
        if match is None:
            self._note(parts, "is at a place the path pattern does not describe")
            return
        try:
            from_party, to_party = FilePoller._parties(self, context, match)
        except Unroutable as exc:
            self._move_unroutable(conn, parts, str(exc))
            return
        file = self._file(conn, parts, size, mtime_ns)
        correlation = correlation_of(self.correlation, parts[-1])
        context.take_file(file, from_party, to_party, parts[-1], correlation)

    def _move_unroutable(self, conn: Connection, parts: Parts, reason: str) -> None:
        target = _join(self.base, (UNROUTABLE,) + parts)
        try:
            with conn.ops:
                placed = _move_without_replacing(conn, _join(self.base, parts), target)
                with conn.sftp.open(placed + ".reason.txt", "w") as out:
                    out.write((reason + "\n").encode("utf-8", "backslashreplace"))
        except Exception as exc:
            self._note(parts, f"is unroutable ({reason}) but could not be moved: {exc}")
            return
        log.warning("%s: %s is unroutable: %s; moved to %s", self.instance_name,
                    _relative(parts), reason, placed)

    def _archive_path(self, parts: Parts) -> str:
        now = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
        name = self.archive_name.format(path=_relative(parts), filename=parts[-1],
                                        timestamp=now)
        return posixpath.join(self.archive or "/", name.lstrip("/"))

    def _error_parties(self, context: SourceContext) -> tuple[str, str]:
        """From and to of a collection error: as configured, else the single
        organization and an empty to (the files would have named them)."""
        from_party = self.config.get("from") or ""
        if not from_party:
            names = context.organizations()
            from_party = names[0] if len(names) == 1 else ""
        return from_party, self.config.get("to") or ""

    # --- probe -------------------------------------------------------------------------
    def probe(self) -> bool | None:
        """Connect (a connection of its own) and stat the remote directory."""
        return probe_directory(self.endpoint, self.base)


class RemoteFile:
    """A remote file as a listing saw it (``b2bhub.plugin.PickedFile``). Its operations
    take the connection's ``ops`` lock: the core removes the last batch's files on a
    thread of its own while the scan reads the next ones."""

    def __init__(self, conn: Connection, base: str, parts: Parts, size: int,
                 mtime_ns: int, after: str, archive_path):
        self.conn, self.parts, self.size, self.mtime_ns = conn, parts, size, mtime_ns
        self.path = None  # never taken by a hard link
        self.remote = _join(base, parts)
        self.relative = _relative(parts)
        self.after, self.keep = after, after == "keep"
        self._archive_path = archive_path

    def _same(self, attrs: paramiko.SFTPAttributes | None) -> bool:
        return attrs is not None and stat.S_ISREG(attrs.st_mode or 0) and (
            attrs.st_size, (attrs.st_mtime or 0) * NS) == (self.size, self.mtime_ns)

    def _stat(self) -> paramiko.SFTPAttributes | None:
        try:
            return self.conn.stat(self.remote)
        except Exception as exc:
            raise _os_error(exc, f"stat {self.remote}") from None

    def open(self) -> IO[bytes]:
        self.conn.ops.acquire()
        try:
            if not self._same(self._stat()):
                raise FileChanged(f"{self.relative} changed")
            handle = self.conn.sftp.open(self.remote, "rb")
        except BaseException as exc:
            self.conn.ops.release()
            if isinstance(exc, OSError) or not isinstance(exc, Exception):
                raise
            raise _os_error(exc, f"opening {self.remote}") from None
        return RemoteStream(self.conn.sftp, handle, self.size, self.conn.ops)

    def unchanged(self) -> bool:
        with self.conn.ops:
            try:
                return self._same(self._stat())
            except OSError:
                return False

    def remove(self) -> bool:
        """delete or move (keep is never removed: the core keeps its row instead)."""
        with self.conn.ops:
            try:
                attrs = self.conn.stat(self.remote)
                if attrs is None:
                    return True  # gone already (moved or removed before a crash)
                if not self._same(attrs):
                    return False  # another file stands there now: left alone
                if self.after == "move":
                    _move_without_replacing(self.conn, self.remote,
                                            self._archive_path(self.parts))
                else:
                    self.conn.remove(self.remote)
            except OSError:
                raise
            except Exception as exc:
                raise _os_error(exc, f"removing {self.remote}") from None
        return True


class RemoteStream:
    """A remote file read front to back by pipelined requests: at most
    :data:`READ_AHEAD` requests of :data:`READ_REQUEST` bytes ahead of the reader, their
    answers taken in order on the reader's own thread. paramiko's prefetch was not used:
    it buffers as much of the file as the network outruns the reader, on a thread per
    call whose memory the process keeps. Failures are OSError (the core leaves the file
    for the next scan). Closing releases the connection's ``ops`` lock."""

    def __init__(self, sftp: paramiko.SFTPClient, remote: paramiko.SFTPFile, size: int,
                 lock: threading.RLock):
        self.sftp, self.remote, self.size, self.lock = sftp, remote, size, lock
        self._asked = 0  # the next offset to ask for
        self._pending: deque[tuple[int, int, int]] = deque()  # (request, offset, length)
        self._early: dict[int, tuple[int, Message]] = {}  # answers read out of order
        self._rest = b""
        self._ended = self._closed = False

    def _async_response(self, kind: int, msg: Message, num: int) -> None:
        """paramiko hands over an answer read while waiting for another one."""
        self._early[num] = (kind, msg)

    def _ask(self) -> None:
        while len(self._pending) < READ_AHEAD and self._asked < self.size:
            length = min(READ_REQUEST, self.size - self._asked)
            num = self.sftp._async_request(self, CMD_READ, self.remote.handle,
                                           int64(self._asked), int(length))
            self._pending.append((num, self._asked, length))
            self._asked += length

    def _answer(self, num: int) -> tuple[int, Message]:
        if num in self._early:
            return self._early.pop(num)
        return self.sftp._read_response(num)

    def _next_piece(self) -> bytes:
        if self._ended:
            return b""
        self._ask()
        if not self._pending:
            return b""
        num, offset, length = self._pending.popleft()
        try:
            kind, msg = self._answer(num)
            if kind == CMD_STATUS:
                self.sftp._convert_status(msg)
            data = msg.get_string()
            while len(data) < length:  # a server that answers less: the rest now
                _kind, msg = self.sftp._request(CMD_READ, self.remote.handle,
                                                int64(offset + len(data)),
                                                int(length - len(data)))
                data += msg.get_string()
        except EOFError:  # shorter than listed: the core sees the size differ
            self._ended = True
            return b""
        return data

    def read(self, size: int = -1) -> bytes:
        try:
            out, have = [self._rest], len(self._rest)
            while size < 0 or have < size:
                piece = self._next_piece()
                if not piece:
                    break
                out.append(piece)
                have += len(piece)
        except OSError:
            raise
        except Exception as exc:
            raise _os_error(exc, "reading") from None
        data = b"".join(out)
        if size < 0:
            self._rest = b""
            return data
        self._rest = data[size:]
        return data[:size]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.remote.close()  # answers still due are read and dropped by paramiko
        except Exception:
            pass
        finally:
            self.lock.release()

    def __enter__(self) -> RemoteStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _move_without_replacing(conn: Connection, source: str, target: str) -> str:
    """Rename ``source`` to ``target`` or the first free ``target.N``; the name used.
    The plain SFTP rename never replaces a file (OpenSSH links the new name)."""
    conn.makedirs(posixpath.dirname(target))
    for n in range(1000):
        candidate = target if n == 0 else f"{target}.{n}"
        if conn.rename(source, candidate, overwrite=False):
            return candidate
    raise SftpError("remote", f"no free name for {target}")


def _os_error(exc: BaseException, doing: str) -> OSError:
    failure = classify(exc, doing)
    return OSError(f"{failure.text} (error class {failure.error_class})")


def _join(base: str, parts: Parts) -> str:
    return posixpath.join(base, *parts) if parts else base


def _relative(parts: Parts) -> str:
    return "/".join(parts)
