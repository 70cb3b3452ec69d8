"""The ``sftp_writer`` target: writes a message's payload stage to a file on an SFTP
server (docs/sftp.md).

Where: ``connection`` ``instance`` logs in with this instance's fields (host, user,
password or key, pinned host key: :data:`.connection.CONNECTION_FIELDS`); ``partner``
with the ``sftp`` profile of the message's to-party. The file's path below
``remote_directory`` comes from ``filename_pattern`` (as ``file_writer``'s); missing
directories are made.

How: the stage is streamed (never whole in memory) to a hidden temporary file beside
its destination (``.b2bhub-<16 hex digits>.part``), optionally ``chmod``-ed, then
renamed into place, so no partner ever sees half a file under its name. With
``overwrite`` off the plain SFTP rename is used, which never replaces a file (OpenSSH
links the new name); with it on, ``posix-rename@openssh.com`` replaces the old file
atomically where the server offers it, elsewhere the old file is removed first and
the new one renamed (docs/sftp.md "Overwriting"). A re-attempt (attempt 2 and later)
that finds the name holding exactly the stage's bytes (same size, same sha256) counts
it as written: an attempt cut short after its rename does not fail its retry.

Failures come back as errors with the classes of :mod:`.connection` (``connection``,
``auth``, ``host_key``, ``permission``, ``no_space``, ``timeout``, ``remote``) for the
retry policy; a ``host_key`` mismatch fails at once by default (``message_failed``
alert): the pinned key must be confirmed again by an operator. A temporary file a
killed worker left behind is removed by the first write into its directory in an hour
(per process) once it is an hour old.

The probe connects (a connection of its own, closed after) and stats the directory.
"""

from __future__ import annotations

import errno
import hashlib
import posixpath
import re
import secrets
import stat
import time
from typing import Any

from b2bhub.plugin import (
    N_,
    DeliveryInfo,
    Outcome,
    PayloadError,
    PayloadReader,
    Plugin,
    RetryPolicy,
    RetryRule,
    ServiceError,
    Strategy,
    TargetContext,
    filename_pattern,
)
from b2bhub.plugin.schema import Field
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
from plugins.sftp.profiles import PROFILE_KIND, endpoint_of_partner

FilenamePattern = filename_pattern.FilenamePattern
PatternError = filename_pattern.PatternError
parse = filename_pattern.parse
placeholder_values = filename_pattern.placeholder_values

DEFAULT_PATTERN = "{original_filename|message_id}"
STAGES = ("raw", "unpacked", "sent")
CHUNK = 1 << 20
TEMP_NAME = re.compile(r"\.b2bhub-[0-9a-f]{16}\.part")
STALE_TEMP_SECONDS = 3600.0
STALE_TEMP_CHECK_SECONDS = 3600.0
#: retried with growing delays for an hour and more; a changed host key fails at once
SFTP_DEFAULT = RetryPolicy(strategy=Strategy.EXPONENTIAL, base_delay=30, max_delay=1800,
                           max_attempts=10, rules=(RetryRule("host_key", "fail"),))


def _absolute_problem(value: str) -> str | None:
    return None if value.startswith("/") else N_("must be an absolute path on the server")


def _mode_problem(value: str | None) -> str | None:
    if not value:
        return None
    return None if re.fullmatch(r"0?[0-7]{3}", value) else N_("must be an octal mode, e.g. "
                                                               "0640")


class SftpWriter(HostKeyActions, Plugin):
    """Writes the chosen payload stage of each message to a file on an SFTP server."""

    type_name = "sftp_writer"
    roles = frozenset({"target"})
    description = ("Uploads each message to a file on an SFTP server (pinned host key, "
                   "temporary name then rename).")
    default_retry_policy = SFTP_DEFAULT
    claim_batch = 8
    profile_kinds = (PROFILE_KIND,)
    config_schema = [
        Field("connection", "choice", label="Connection", default="instance",
              choices=("instance", "partner"),
              help="instance: the fields below; partner: the sftp profile of the "
                   "message's to-party"),
        *CONNECTION_FIELDS,
        Field("remote_directory", "string", label="Remote directory", required=True,
              validate=_absolute_problem,
              help="absolute directory on the server below which files are written; "
                   "made if missing"),
        Field("filename_pattern", "string", label="File name pattern",
              default=DEFAULT_PATTERN, validate=filename_pattern.problem,
              help="file name below the remote directory, e.g. {to}/{original_filename}"),
        Field("overwrite", "boolean", label="Overwrite an existing file", default=False,
              help="replace a file of the same name; when off such a message fails"),
        Field("chmod", "string", label="File mode", default="", validate=_mode_problem,
              help="octal mode set on each file before it gets its name, e.g. 0640; "
                   "empty: the server's default"),
        Field("payload_stage", "choice", label="Payload stage", default="unpacked",
              choices=STAGES, help="which recorded stage of the message is written"),
    ]

    @classmethod
    def action_refused(cls, config: dict[str, Any]) -> None:
        if (config.get("connection") or "instance") != "instance":
            raise ServiceError(N_("this writer connects as each partner's SFTP profile "
                                  "says: pin the host key on the partner's profile"),
                               {"connection": "partner"})

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> dict[str, str]:
        if config.get("connection", "instance") != "instance":
            return {}
        return Endpoint.from_config(config).problems()

    def __init__(self, instance_name: str, config: dict[str, Any]):
        super().__init__(instance_name, config)
        self.mode = config.get("connection") or "instance"
        self.endpoint = Endpoint.from_config(config) if self.mode == "instance" else None
        self.directory = (config.get("remote_directory") or "/").rstrip("/") or "/"
        self.overwrite = bool(config.get("overwrite"))
        self.chmod = int(config["chmod"], 8) if config.get("chmod") else None
        self.stage = config.get("payload_stage") or "unpacked"
        try:
            self.pattern: FilenamePattern | None = parse(
                config.get("filename_pattern") or DEFAULT_PATTERN)
            self.pattern_problem = ""
        except PatternError as exc:
            self.pattern, self.pattern_problem = None, str(exc)
        self._swept: dict[tuple, float] = {}

    # --- delivering --------------------------------------------------------------------
    def deliver(self, delivery: DeliveryInfo, payload: PayloadReader,
                context: TargetContext) -> Outcome:
        if self.stage not in payload.stages():
            return Outcome.failed(f"the message has no '{self.stage}' payload stage")
        try:
            relative = self._relative_path(delivery)
        except PatternError as exc:
            return Outcome.failed(f"the filename pattern fails: {exc}")
        if any(part in ("", ".", "..") for part in relative.split("/")):
            return Outcome.failed(f"the file name {relative!r} is not a plain relative path")
        try:
            owner, endpoint = self._where(delivery)
        except SftpError as exc:
            return Outcome.failed(exc.text)
        final = posixpath.join(self.directory, relative)
        try:
            return self._deliver(owner, endpoint, final, relative, payload, context,
                                 reattempt=delivery.attempt > 1)
        except PayloadError as exc:
            return Outcome.error("payload", f"could not read the payload: {exc}")
        except SftpError as exc:
            return Outcome.error(exc.error_class, f"{exc.text} ({endpoint.where}, "
                                 f"{final}; error class {exc.error_class})", file=final)

    def _where(self, delivery: DeliveryInfo) -> tuple[str, Endpoint]:
        if self.endpoint is not None:
            return f"instance:{self.instance_name}", self.endpoint
        return f"partner:{delivery.to_party}", endpoint_of_partner(delivery.to_party)

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

    def _deliver(self, owner: str, endpoint: Endpoint, final: str, relative: str,
                 payload: PayloadReader, context: TargetContext, reattempt: bool
                 ) -> Outcome:
        directory = posixpath.dirname(final)
        tmp = posixpath.join(directory, f".b2bhub-{secrets.token_hex(8)}.part")
        for fresh in (False, True):
            with POOL.connection(owner, endpoint, fresh=fresh) as (conn, reused):
                try:
                    if reattempt and not self.overwrite and conn.stat(final) is not None:
                        return self._taken(conn, final, relative, payload, reattempt)
                    remote = self._create(conn, directory, tmp)
                except Exception as exc:
                    failure = classify(exc, f"creating a file in {directory}")
                    if reused and not fresh and failure.error_class in (
                            "connection", "timeout"):
                        # a kept connection the server dropped meanwhile (restarted,
                        # idle timeout): nothing was sent, connect again once
                        POOL.discard(owner, endpoint, conn)
                        continue
                    raise failure from None
                return self._upload(conn, remote, tmp, final, relative, payload, context,
                                    reattempt)
        raise SftpError("connection", "the connection was lost twice")

    def _create(self, conn: Connection, directory: str, tmp: str):
        """The temporary file opened for writing. Its directory is made (with its
        parents) when this connection has not seen it yet, or when it was removed
        since; a directory it has seen costs no round trip."""
        if directory in conn.known_dirs:
            try:
                return conn.sftp.open(tmp, "wb")
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                conn.known_dirs.discard(directory)
        conn.makedirs(directory)
        conn.known_dirs.add(directory)
        self._sweep(conn, directory)
        return conn.sftp.open(tmp, "wb")

    def _upload(self, conn: Connection, remote, tmp: str, final: str, relative: str,
                payload: PayloadReader, context: TargetContext, reattempt: bool
                ) -> Outcome:
        directory = posixpath.dirname(final)
        context.wire_started()
        try:
            with payload.open(self.stage) as stream:
                size = conn.write_stream(tmp, stream, remote=remote)
            if self.chmod is not None:
                conn.sftp.chmod(tmp, self.chmod)
            placed = conn.rename(tmp, final, self.overwrite)
        except BaseException as exc:
            if isinstance(exc, PayloadError | SftpError) or not isinstance(exc, Exception):
                _remove_quietly(conn, tmp)
                raise
            failure = classify(exc, f"writing {final}")
            if failure.error_class == "remote" and not conn.alive:  # the server went away
                failure = SftpError("connection", f"writing {final}: connection lost "
                                    f"({failure.text})")
            # asked while the temporary file still takes its space
            elif failure.error_class == "remote" and _out_of_space(conn, directory):
                failure = SftpError("no_space", f"writing {final}: no space left on the "
                                    "server")
            _remove_quietly(conn, tmp)
            raise failure from None
        if not placed:
            _remove_quietly(conn, tmp)
            return self._taken(conn, final, relative, payload, reattempt)
        return Outcome.delivered(f"uploaded {final} ({size} bytes)", file=final, size=size)

    def _taken(self, conn: Connection, final: str, relative: str, payload: PayloadReader,
               reattempt: bool) -> Outcome:
        """The name exists and overwrite is off: written already, or failed."""
        try:
            same = reattempt and _holds(conn, final, payload, self.stage)
        except OSError as exc:
            raise classify(exc, f"reading {final}") from None
        if same:
            size = payload.size(self.stage)
            return Outcome.delivered(f"{final} already holds this payload ({size} bytes); "
                                     "counted as written", file=final, size=size)
        return Outcome.failed(f"{final} exists and overwrite is off", file=final)

    def _sweep(self, conn: Connection, directory: str) -> None:
        """Remove this directory's temporary files older than an hour, at most once an
        hour per process and directory (module docstring)."""
        key = (conn.endpoint.cache_key(), directory)
        last = self._swept.get(key)
        if last is not None and time.monotonic() - last < STALE_TEMP_CHECK_SECONDS:
            return
        self._swept[key] = time.monotonic()
        remove_stale_temp_files(conn, directory)

    # --- probe -------------------------------------------------------------------------
    def probe(self) -> bool | None:
        """Connect (a connection of its own) and stat the remote directory."""
        if self.endpoint is None:
            return None
        return probe_directory(self.endpoint, self.directory, make=True)


def remove_stale_temp_files(conn: Connection, directory: str,
                            older_than: float = STALE_TEMP_SECONDS) -> int:
    """Remove the files named as this writer names its temporary files that were last
    written ``older_than`` seconds ago or more; how many went."""
    cutoff = time.time() - older_than
    removed = 0
    try:
        for entry in conn.listdir(directory):
            if entry.is_file and TEMP_NAME.fullmatch(entry.name) and entry.mtime < cutoff:
                removed += conn.remove(posixpath.join(directory, entry.name))
    except Exception:
        pass  # another try in an hour
    return removed


def _holds(conn: Connection, path: str, payload: PayloadReader, stage: str) -> bool:
    """True if ``path`` is a regular file with exactly the stage's bytes."""
    found = conn.stat(path)
    if found is None or not stat.S_ISREG(found.st_mode or 0) \
            or found.st_size != payload.size(stage):
        return False
    digest = hashlib.sha256()
    with conn.open_read(path) as remote:
        while chunk := remote.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest() == payload.digest(stage)


def _out_of_space(conn: Connection, directory: str) -> bool:
    """After a plain failure: is the server's file system full? OpenSSH's sftp-server
    reports ENOSPC as a plain failure; its statvfs extension says what is free."""
    try:
        free = conn.free_bytes(directory)
    except Exception:
        return False
    return free is not None and free < 64 * 1024


def _remove_quietly(conn: Connection, path: str) -> None:
    try:
        conn.remove(path)
    except Exception:
        pass
