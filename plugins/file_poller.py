"""The file poller (SPEC 9; seed 002 "File poller" and "Path pattern").

Every ``polling_interval`` seconds it walks ``base_directory`` exactly as deep as its
path pattern, never through a symbolic link, and hands each complete file (size and
mtime the same as at the previous scan) that matches the path and file patterns to its
context, which stores it and removes it after the commit (or, with
``archive_directory``, moves it there; see :class:`LocalFile`). The payload store gets a copy
of the file; with ``take_by_link`` the file itself, by a hard link (no new file): the
stored message then shares the file's bytes until the file is removed after the commit,
so a sender that rewrote the file in place in between would change it (the read's
sha256 check would then refuse the payload). A copy keeps the first version intact and
the rewritten file becomes a message of its own; hence the copy by default. A file
whose parties cannot be resolved is moved to ``unroutable/<its relative path>`` with
the reason beside it; a file at a place the pattern does not describe is left alone and
logged once.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from time import monotonic
from typing import IO, Any

from b2bhub.plugin import (
    MOST_SHARDS,
    N_,
    WHOLE,
    FileChanged,
    Plugin,
    PluginStartError,
    SourceContext,
    path_pattern,
    validate_name,
)
from b2bhub.plugin.schema import Field

UNROUTABLE, Match, PatternError = (path_pattern.UNROUTABLE, path_pattern.Match,
                                   path_pattern.PatternError)

log = logging.getLogger(__name__)
MAX_PATH_TEXT = 1024  # bytes of a relative path as recorded
MAX_NAME_TEXT = 255   # characters of an original file name as recorded
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
Parts = tuple[str, ...]


class Unroutable(Exception):
    """The file cannot become a message; the text is its reason."""


def _pattern_problem(value: str) -> str | None:
    """The pattern's own rules; how it goes with from and to is checked across fields."""
    try:
        path_pattern.parse_shape(value)
    except PatternError as exc:
        return exc.args[0]  # the Text: shown in the reader's language
    return None


def _file_pattern_problem(value: str) -> str | None:
    return N_("is matched on the file name alone; it may not hold /") if "/" in value \
        else None


def _correlation_problem(value: str) -> str | None:
    try:
        compiled = re.compile(value)
    except re.error as exc:
        return N_("is not a regular expression: %(why)s", why=str(exc))
    if not compiled.groups:
        return N_("needs a group, e.g. (?P<correlation_id>PO-[0-9]+), capturing the id")
    return None


def correlation_of(pattern: re.Pattern | None, name: str) -> str | None:
    """The correlation id ``pattern`` captures in a file name: the group named
    ``correlation_id``, else the first group; None without a pattern, a match or a
    non-empty capture. The pattern is searched (anywhere in the name)."""
    if pattern is None:
        return None
    found = pattern.search(name)
    if found is None:
        return None
    value = (found.group("correlation_id") if "correlation_id" in pattern.groupindex
             else found.group(1))
    return value[:255] or None


def _party_problem(value: str) -> str | None:
    return validate_name(value)


class FilePoller(Plugin):
    type_name = "file_poller"
    roles = frozenset({"source"})
    description = "Makes a message of each file that appears below a directory."
    #: seconds one poll may go on scanning in this process (see :meth:`poll`)
    scan_budget = 20.0
    config_schema = [
        Field("base_directory", "path", label="Base directory", required=True,
              help="the directory scanned; created when the instance starts"),
        Field("polling_interval", "integer", label="Polling interval (seconds)",
              default=10, min=1, max=86400,
              help="seconds between two scans"),
        Field("path_pattern", "string", label="Path pattern",
              default="{filename}", validate=_pattern_problem,
              help="where files are, relative to base_directory: elements separated by /, "
                   "each literal text or one of {from}, {to}, {filename}"),
        Field("file_pattern", "string", label="File name pattern",
              default="*", validate=_file_pattern_problem,
              help="a glob the file name must match (e.g. *.xml)"),
        Field("from", "string", label="From party", validate=_party_problem,
              help="the sender, unless captured by {from}; left empty (and not captured) "
                   "it is the single organization"),
        Field("to", "string", label="To party", validate=_party_problem,
              help="the business partner, unless captured by {to}"),
        Field("correlation_pattern", "string", label="Correlation id pattern",
              validate=_correlation_problem,
              help="a regular expression searched in the file name whose group named "
                   "correlation_id (else its first group) is the message's correlation "
                   "id, e.g. ^ORDERS_(?P<correlation_id>[0-9]+)\\.xml$; empty, or no "
                   "match: no correlation id"),
        Field("archive_directory", "path", label="Archive directory",
              help="empty: a file is removed once its message is stored; else it is moved "
                   "here, to the same relative path (a name already taken gets .1, .2, "
                   "...). Outside base_directory; created when the instance starts"),
        Field("take_by_link", "boolean", label="Take files by hard link", default=False,
              help="senders write each file elsewhere and rename it in, never rewrite "
                   "one in place: take files into the payload store by a hard link "
                   "instead of a copy (one file fewer per message; copied anyway from "
                   "another file system, and into an s3:// payload store). A file "
                   "rewritten in place between its pickup and its removal would change "
                   "the stored message"),
        Field("scan_shards", "integer", label="Scan shards", default=1, min=1,
              max=MOST_SHARDS,
              help="1: one process scans the directory at a time. More: the scan is "
                   "split into that many shards by a hash of each file's path, each "
                   "scanned under a lease of its own, so that many worker processes "
                   "take files at once (each lists the whole tree and takes its own "
                   "files)"),
    ]

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> dict[str, str]:
        try:
            _parse(config)
        except PatternError as exc:
            return {"path_pattern": exc.args[0]}
        archive, base = config.get("archive_directory"), config.get("base_directory")
        if archive and base:
            archive_path, base_path = Path(os.path.abspath(archive)), Path(
                os.path.abspath(base))
            if archive_path == base_path or base_path in archive_path.parents:
                return {"archive_directory": N_("must be outside base_directory (its "
                                                "files would be picked up again)")}
        return {}

    def __init__(self, instance_name: str, config: dict[str, Any]):
        super().__init__(instance_name, config)
        self.base = Path(config["base_directory"])
        self.pattern = _parse(config)
        self.file_pattern = config.get("file_pattern") or "*"
        self.take_by_link = bool(config.get("take_by_link"))
        self.correlation = (re.compile(config["correlation_pattern"])
                            if config.get("correlation_pattern") else None)
        self.archive = Path(config["archive_directory"]) if config.get(
            "archive_directory") else None
        #: what the last scan of each shard saw in this process: shard index -> listing
        self._previous: dict[int, dict[Parts, tuple[int, int]]] = {}
        self._logged = LogOnce()

    def start(self) -> None:
        """Create ``base_directory``; the reason if it cannot be."""
        try:
            self.base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PluginStartError(f"cannot create base_directory {self.base}: "
                                   f"{exc.strerror or exc}") from exc
        if not self.base.is_dir():
            raise PluginStartError(f"base_directory {self.base} is not a directory")
        if self.archive is not None:
            try:
                self.archive.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise PluginStartError(f"cannot create archive_directory {self.archive}: "
                                       f"{exc.strerror or exc}") from exc

    # the scan ----------------------------------------------------------------
    def poll(self, context: SourceContext) -> None:
        """Finish what a crash left, then scan: take the files complete by now.

        A file is complete once two scans saw the same size and mtime, and what a scan
        saw is known to the process that ran it. When a scan lasted a whole polling
        interval, the next one is due as it ends; if it saw files not complete yet,
        this process runs that next scan at once (in another process, whichever took
        the task, they would all be first sightings), up to ``scan_budget`` seconds."""
        context.recover_files(self.find)
        began = monotonic()
        interval = float(self.config.get("polling_interval") or 10)
        while True:
            started = monotonic()
            waiting = self._scan(context)
            ended = monotonic()
            if (not waiting or ended - started < interval
                    or ended - began >= self.scan_budget):
                return

    def _scan(self, context: SourceContext) -> int:
        """One scan of the context's shard (its files alone: those whose recorded path
        it owns); how many files it saw that are not complete yet."""
        shard = getattr(context, "shard", WHOLE)
        current: dict[Parts, tuple[int, int]] = {}
        previous = self._previous.get(shard.index, {})
        waiting = 0
        for parts, seen in self._candidates(shard.owns if shard.count > 1 else None):
            current[parts] = seen
            if previous.get(parts) == seen:
                self._pick_up(context, parts, seen)
            else:
                waiting += 1
        self._previous[shard.index] = current
        context.flush()
        return waiting

    def _candidates(self, owns: Callable[[str], bool] | None = None
                    ) -> Iterator[tuple[Parts, tuple[int, int]]]:
        """Files at described places whose name matches the file pattern (and whose
        recorded path ``owns`` takes, when given)."""
        for parts, entry in self._walk(()):
            if not fnmatchcase(parts[-1], self.file_pattern) or (
                    owns is not None and not owns(record_text(parts))):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield parts, (st.st_size, st.st_mtime_ns)

    def _walk(self, parts: Parts) -> Iterator[tuple[Parts, os.DirEntry]]:
        level, last = len(parts), len(parts) == self.pattern.depth - 1
        literal = self.pattern.literal(level)
        for entry in self._entries(parts):
            here = parts + (entry.name,)
            if level == 0 and entry.name == UNROUTABLE:
                continue
            if entry.is_symlink():
                self._note(here, "is a symbolic link; not followed")
            elif literal is not None and entry.name != literal:
                self._note(here, "is at a place the path pattern does not describe")
            elif last and entry.is_file(follow_symlinks=False):
                yield here, entry
            elif not last and entry.is_dir(follow_symlinks=False):
                yield from self._walk(here)
            else:
                self._note(here, "is at a place the path pattern does not describe")

    def _entries(self, parts: Parts) -> list[os.DirEntry]:
        try:
            with os.scandir(self.base.joinpath(*parts)) as listing:
                return sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            if not parts:
                raise
            self._note(parts, f"cannot be listed: {exc.strerror or exc}")
            return []

    def _note(self, parts: Parts, what: str) -> None:
        if self._logged.first(parts):
            log.warning("%s: %s %s; left alone", self.instance_name, record_text(parts), what)

    # one file ----------------------------------------------------------------
    def _pick_up(self, context: SourceContext, parts: Parts, seen: tuple[int, int]) -> None:
        match = self.pattern.match(parts)
        if match is None:
            self._note(parts, "is at a place the path pattern does not describe")
            return
        try:
            from_party, to_party = self._parties(context, match)
            filename = _recordable(parts)
        except Unroutable as exc:
            self._move_unroutable(parts, str(exc))
            return
        file = LocalFile(self.base, parts, *seen, linkable=self.take_by_link,
                         archive=self.archive)
        correlation = correlation_of(self.correlation, parts[-1])
        if correlation is None:
            context.take_file(file, from_party, to_party, filename)
        else:
            context.take_file(file, from_party, to_party, filename, correlation)

    def _parties(self, context: SourceContext, match: Match) -> tuple[str, str]:
        """From and to of a file, as the seed says; Unroutable with the reason if not."""
        to_party = self.config.get("to") or match.to_party
        if context.party_kind(to_party) != "partner":
            how = "captured by {to}" if match.to_party else "set as to on the poller"
            raise Unroutable(f"{_shown(to_party)} ({how}) is not a business partner")
        fixed = self.config.get("from")
        if fixed:
            if context.party_kind(fixed) is None:
                raise Unroutable(f"{fixed!r} (set as from on the poller) is not a party")
            return fixed, to_party
        if match.from_party is not None:
            if context.party_kind(match.from_party) != "organization":
                raise Unroutable(f"{_shown(match.from_party)} (captured by {{from}}) is "
                                 "not an organization")
            return match.from_party, to_party
        return _single_organization(context), to_party

    def _move_unroutable(self, parts: Parts, reason: str) -> None:
        try:
            moved = move_unroutable(self.base, parts, reason)
        except OSError as exc:
            self._note(parts, f"is unroutable ({reason}) but could not be moved: {exc}")
            return
        log.warning("%s: %s is unroutable: %s; moved to %s", self.instance_name,
                    record_text(parts), reason, record_text(moved))

    def find(self, relative: str) -> LocalFile | None:
        """The regular file now at a recorded relative path, or None."""
        parts = parts_of(relative)
        try:
            st = stat_at(self.base, parts)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return LocalFile(self.base, parts, st.st_size, st.st_mtime_ns, archive=self.archive)


def _parse(config: dict[str, Any]) -> path_pattern.PathPattern:
    return path_pattern.parse(config.get("path_pattern") or "{filename}",
                              fixed_from=bool(config.get("from")),
                              fixed_to=bool(config.get("to")))


def _single_organization(context: SourceContext) -> str:
    names = context.organizations()
    if len(names) == 1:
        return names[0]
    if not names:
        raise Unroutable("no from: the poller sets none, captures none, and there is no "
                         "organization")
    raise Unroutable(f"no from: the poller sets none, captures none, and there are "
                     f"{len(names)} organizations ({', '.join(names)})")


def _shown(name: str) -> str:
    """A captured name as a reason shows it: quoted, control characters escaped."""
    return repr(record_text((name,)))


def _recordable(parts: Parts) -> str:
    """The original file name as recorded; Unroutable if the path is too long to record."""
    if len(record_text(parts).encode()) > MAX_PATH_TEXT:
        raise Unroutable(f"its path is longer than {MAX_PATH_TEXT} bytes")
    name = record_text(parts[-1:])
    if len(name) > MAX_NAME_TEXT:
        raise Unroutable(f"its name is longer than {MAX_NAME_TEXT} characters")
    return name


# --- names as recorded ----------------------------------------------------------------

def record_text(parts: Parts) -> str:
    """A relative path as valid text, reversibly: bytes that are not UTF-8 become
    ``\\xNN`` and a backslash ``\\\\`` (see :func:`parts_of`)."""
    return "/".join(_escape(p) for p in parts)


def _escape(name: str) -> str:
    if "\\" not in name and (name.isascii() or _encodable(name)):
        return name  # nothing to escape: the common case, listed at every scan
    out = []
    for char in name:
        if char == "\\":
            out.append("\\\\")
        elif "\udc80" <= char <= "\udcff":  # an undecodable byte (surrogateescape)
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            out.append(char)
    return "".join(out)


def _encodable(name: str) -> bool:
    """No undecodable byte (surrogateescape) in the name."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parts_of(text: str) -> Parts:
    """The path elements :func:`record_text` made ``text`` of."""
    return tuple(_unescape(p) for p in text.split("/"))


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text.startswith("\\\\", i):
            out.append("\\")
            i += 2
        elif text.startswith("\\x", i) and len(text) >= i + 4:
            out.append(chr(0xDC00 + int(text[i + 2:i + 4], 16)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


# --- the filesystem, never through a symbolic link ------------------------------------

def open_dir(base: Path, parts: Parts, create: bool = False) -> int:
    """A descriptor of ``base/parts...``, refusing a symbolic link at every element."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in parts:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def stat_at(base: Path, parts: Parts) -> os.stat_result:
    fd = open_dir(base, parts[:-1])
    try:
        return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


class LocalFile:
    """A file below the base directory as it was seen (see plugin_api.PickedFile).

    With ``archive``, "removing" it moves it to ``archive/<its relative path>``: a hard
    link there first, then its name in the base directory unlinked (a rename where
    links are not allowed), both made durable by :meth:`sync_removal` before the pickup
    row goes, so the crash safety is that of a removal. A crash between the link and
    the unlink leaves both names; the recovery finds the file in the archive under one
    of its names (the same inode) and only unlinks it, so it is never archived twice."""

    def __init__(self, base: Path, parts: Parts, size: int, mtime_ns: int,
                 linkable: bool = False, archive: Path | None = None):
        self.base, self.parts, self.size, self.mtime_ns = base, parts, size, mtime_ns
        self.archive = archive
        self.relative = record_text(parts)
        self.directory = (str(base), parts[:-1])  # what sync_removal fsyncs
        # With take_by_link, its name for the payload store to hard-link (the store
        # checks that the name still is the file open() gave, whatever lies on the way).
        self.path = base.joinpath(*parts) if linkable else None

    def open(self) -> IO[bytes]:
        fd = open_dir(self.base, self.parts[:-1])
        try:
            file_fd = os.open(self.parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
                              dir_fd=fd)
        finally:
            os.close(fd)
        if not self._same(os.fstat(file_fd)):
            os.close(file_fd)
            raise FileChanged(f"{self.relative} changed")
        return os.fdopen(file_fd, "rb")

    def unchanged(self) -> bool:
        try:
            return self._same(stat_at(self.base, self.parts))
        except OSError:
            return False

    def _same(self, st: os.stat_result) -> bool:
        return stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (
            self.size, self.mtime_ns)

    def remove(self) -> bool:
        fd = open_dir(self.base, self.parts[:-1])
        try:
            if not self._same(os.stat(self.parts[-1], dir_fd=fd, follow_symlinks=False)):
                return False
            if self.archive is not None:
                self._archive(fd)
            else:
                os.unlink(self.parts[-1], dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
        return True

    def _archive(self, src: int) -> None:
        dst = open_dir(self.archive, self.parts[:-1], create=True)
        try:
            _move_without_replacing(src, dst, self.parts[-1], same_inode_done=True)
        finally:
            os.close(dst)

    def sync_removal(self) -> None:
        """Make the removal durable: fsync the directory it was in (the archive's
        directory first, so the new name is durable before the old one is gone)."""
        places = [(self.base, self.parts[:-1])]
        if self.archive is not None:
            places.insert(0, (self.archive, self.parts[:-1]))
        for root, parts in places:
            fd = open_dir(root, parts)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def move_unroutable(base: Path, parts: Parts, reason: str) -> Parts:
    """Move a file to ``unroutable/<its relative path>`` without replacing a file there
    (the new one gets a suffix .1, .2, ...) and write the reason beside it."""
    src = open_dir(base, parts[:-1])
    dst = None
    try:
        dst = open_dir(base, (UNROUTABLE,) + parts[:-1], create=True)
        name = _move_without_replacing(src, dst, parts[-1])
        _write_reason(dst, name, reason)
    finally:
        os.close(src)
        if dst is not None:
            os.close(dst)
    return (UNROUTABLE,) + parts[:-1] + (name,)


def _move_without_replacing(src: int, dst: int, name: str,
                            same_inode_done: bool = False) -> str:
    """Move ``name`` from the directory ``src`` to ``dst`` under the first free name of
    name, name.1, ...; with ``same_inode_done``, a name in ``dst`` that already is this
    very file (a move a crash interrupted after its link) completes the move."""
    for n in range(10000):
        candidate = name if n == 0 else f"{name}.{n}"
        try:
            os.link(name, candidate, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
        except FileExistsError:
            if same_inode_done and _same_inode(src, name, dst, candidate):
                os.unlink(name, dir_fd=src)
                return candidate
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if _exists(dst, candidate):
                continue
            os.rename(name, candidate, src_dir_fd=src, dst_dir_fd=dst)
            return candidate
        os.unlink(name, dir_fd=src)
        return candidate
    raise FileExistsError(errno.EEXIST, "no free name in unroutable", name)


def _same_inode(src: int, name: str, dst: int, candidate: str) -> bool:
    try:
        a = os.stat(name, dir_fd=src, follow_symlinks=False)
        b = os.stat(candidate, dir_fd=dst, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _write_reason(dir_fd: int, name: str, reason: str) -> None:
    fd = os.open(f"{name}.reason.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as out:
        out.write(reason + "\n")


class LogOnce:
    """Remembers what was logged, up to ``limit`` entries (the oldest are forgotten)."""

    def __init__(self, limit: int = 10000):
        self.limit = limit
        self._seen: OrderedDict[Any, None] = OrderedDict()

    def first(self, key: Any) -> bool:
        """True the first time ``key`` is seen (since it was last forgotten)."""
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > self.limit:
            self._seen.popitem(last=False)
        return True
