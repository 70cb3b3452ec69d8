"""One SFTP connection description for the SFTP source and target (docs/sftp.md).

An :class:`Endpoint` says where and how to log in: host, port, user, a password or a
private key (ed25519, RSA, ECDSA; with its passphrase) and the server's **pinned host
key**. It comes from an instance's configuration (:data:`CONNECTION_FIELDS`) or from a
partner's ``sftp`` profile (:mod:`.profiles`). No connection is made without a pinned
key: the key exchange runs first, the key the server proves it holds is compared with the
pinned one, and on any difference the connection is closed before a password, a key
signature or a byte of data leaves (:class:`SftpError` ``host_key``, "host key
mismatch").

:data:`POOL` keeps one connection per worker process and owner (an instance, or a
partner's profile) and endpoint: reused by the next attempt, closed after
``idle_seconds`` without use by a reaper thread, and dropped by whoever saw it fail.
SSH keep-alives go every ``keepalive`` seconds; connecting and each SFTP operation are
bounded by ``connect_timeout`` and ``operation_timeout``.

What a poller needs is here too: :meth:`Connection.listdir` (names with size and
mtime), :meth:`Connection.open_read` (a streaming read), :meth:`Connection.rename`,
:meth:`Connection.remove`.

Failures are raised as :class:`SftpError` with an error class for retry policies:
``connection``, ``auth``, ``host_key``, ``permission``, ``no_space``, ``timeout``, and
``remote`` for any other failure the server reports (:func:`classify`).
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import io
import os
import posixpath
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import paramiko
from paramiko.message import Message
from paramiko.sftp import CMD_EXTENDED, CMD_INIT, CMD_VERSION, CMD_WRITE, SFTPError, int64

from b2bhub.plugin import N_
from b2bhub.plugin.schema import Field

#: the host key types accepted (what OpenSSH servers offer)
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
             "ecdsa-sha2-nistp521", "ssh-rsa")
#: host key algorithms to ask for, by the pinned key's type (an RSA key signs with SHA-2)
_ALGORITHMS = {"ssh-rsa": ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]}
ERROR_CLASSES = ("connection", "auth", "host_key", "permission", "no_space", "timeout",
                 "remote")
SECRET_FIELDS = ("password", "private_key", "passphrase")
#: bytes per SFTP write request, and how many go ahead of their answers
WRITE_REQUEST = 32768
WRITE_WINDOW = 32
_NETWORK_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED,
                   errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPIPE, errno.ENOTCONN,
                   errno.EADDRNOTAVAIL}


class SftpError(Exception):
    """A failure with its error class (module docstring) and a reason to show."""

    def __init__(self, error_class: str, text: str) -> None:
        super().__init__(text)
        self.error_class = error_class
        self.text = text


# --- host keys -------------------------------------------------------------------------

@dataclass(frozen=True)
class HostKey:
    """A public host key: its type and its wire form (the base64 of OpenSSH's files)."""

    type: str
    blob: bytes

    @classmethod
    def parse(cls, text: str) -> HostKey:
        """A key as pasted: ``ssh-ed25519 AAAA... [comment]``, or a known_hosts line
        (``host[,host] ssh-ed25519 AAAA...``, ``[host]:port ...``, with or without
        markers); ValueError saying why not."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(N_("no host key given"))
        lines = [line for line in text.strip().splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        if len(lines) != 1:
            raise ValueError(N_("give one host key (one line)"))
        if lines[0].lstrip().startswith("@"):  # @cert-authority, @revoked
            raise ValueError(N_("a marked known_hosts line (@cert-authority, @revoked) "
                                "is not a host key to pin"))
        words = lines[0].split()
        for n, word in enumerate(words[:-1]):
            if word in KEY_TYPES:
                try:
                    blob = base64.b64decode(words[n + 1], validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError(N_("the key after the type is not base64")) from None
                inner = _wire_string(blob)
                if inner != word.encode():
                    raise ValueError(N_("the key data is not a %(type)s key", type=word))
                try:
                    paramiko.PKey.from_type_string(word, blob)
                except Exception as exc:
                    raise ValueError(N_("not a valid %(type)s key: %(why)s", type=word,
                                        why=str(exc))) from None
                return cls(word, blob)
        raise ValueError(N_("no public key found: expected e.g. 'ssh-ed25519 AAAA...' "
                            "(types: %(types)s)", types=", ".join(KEY_TYPES)))

    @classmethod
    def of(cls, key: paramiko.PKey) -> HostKey:
        blob = key.asbytes()
        return cls(_wire_string(blob).decode(), blob)

    @property
    def fingerprint(self) -> str:
        """As OpenSSH shows it: ``SHA256:`` and the unpadded base64 of the digest."""
        digest = hashlib.sha256(self.blob).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    @property
    def line(self) -> str:
        return f"{self.type} {base64.b64encode(self.blob).decode()}"


def _wire_string(blob: bytes) -> bytes:
    if len(blob) < 4:
        return b""
    (length,) = struct.unpack(">I", blob[:4])
    return blob[4:4 + length]


def host_key_problem(value: str | None) -> str | None:
    """A configuration check: None when empty or a key :meth:`HostKey.parse` reads."""
    if not value:
        return None
    try:
        HostKey.parse(value)
    except ValueError as exc:
        return exc.args[0]  # a Text: shown in the reader's language
    return None


# --- private keys ----------------------------------------------------------------------

_KEY_CLASSES = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)


def load_private_key(text: str, passphrase: str | None = None) -> paramiko.PKey:
    """An OpenSSH or PEM private key (ed25519, ECDSA, RSA); ValueError saying why not
    (a wrong or missing passphrase says so), a text of ours (:func:`N_`)."""
    if not isinstance(text, str) or "PRIVATE KEY" not in text:
        raise ValueError(N_("not a private key (expected an OpenSSH or PEM private key)"))
    last: Exception | None = None
    for cls in _KEY_CLASSES:
        try:
            return cls.from_private_key(io.StringIO(text), password=passphrase or None)
        except paramiko.PasswordRequiredException:
            raise ValueError(N_("the private key needs its passphrase")) from None
        except (paramiko.SSHException, ValueError, TypeError, IndexError) as exc:
            last = exc
            if "passphrase" in str(exc).lower() or "password" in str(exc).lower():
                raise ValueError(N_("the passphrase does not open the private key")) \
                    from None
    raise ValueError(N_("the private key cannot be read: %(why)s", why=str(last)))


def private_key_problem(value: str | None) -> str | None:
    if not value:
        return None
    if "PRIVATE KEY" not in value:
        return N_("not a private key (expected an OpenSSH or PEM private key)")
    return None


# --- the description -------------------------------------------------------------------

#: the connection fields of an instance's configuration (and of the ``sftp`` profile)
CONNECTION_FIELDS = [
    Field("host", "string", label="Host", help="the SFTP server's name or address"),
    Field("port", "integer", label="Port", default=22, min=1, max=65535),
    Field("username", "string", label="User"),
    Field("password", "secret", label="Password",
          help="the password, or leave empty and give a private key"),
    Field("private_key", "secret", label="Private key",
          validate=private_key_problem,
          help="an OpenSSH or PEM private key (ed25519, RSA, ECDSA)"),
    Field("passphrase", "secret", label="Private key passphrase"),
    Field("host_key", "string", label="Pinned host key", validate=host_key_problem,
          help="the server's public host key, 'ssh-ed25519 AAAA...' or a known_hosts "
               "line; required before the first connection"),
    Field("connect_timeout", "integer", label="Connect timeout (seconds)", default=15,
          min=1, max=300),
    Field("operation_timeout", "integer", label="Operation timeout (seconds)", default=60,
          min=1, max=3600, help="the longest wait for any one answer of the server"),
    Field("keepalive", "integer", label="Keep-alive (seconds)", default=30, min=0,
          max=3600, help="an SSH keep-alive every so many seconds (0: none)"),
    Field("idle_close", "integer", label="Close when idle (seconds)", default=60, min=1,
          max=86400, help="a kept connection unused this long is closed"),
]


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect (module docstring)."""

    host: str
    port: int = 22
    username: str = ""
    password: str | None = None
    private_key: str | None = None
    passphrase: str | None = None
    host_key: str | None = None
    connect_timeout: float = 15.0
    operation_timeout: float = 60.0
    keepalive: int = 30
    idle_close: float = 60.0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Endpoint:
        def number(name, default):
            value = config.get(name)
            return default if value in (None, "") else value
        return cls(host=config.get("host") or "", port=int(number("port", 22)),
                   username=config.get("username") or "",
                   password=config.get("password") or None,
                   private_key=config.get("private_key") or None,
                   passphrase=config.get("passphrase") or None,
                   host_key=config.get("host_key") or None,
                   connect_timeout=float(number("connect_timeout", 15)),
                   operation_timeout=float(number("operation_timeout", 60)),
                   keepalive=int(number("keepalive", 30)),
                   idle_close=float(number("idle_close", 60)))

    def problems(self) -> dict[str, str]:
        """What keeps this description from being used, by field."""
        found = {}
        if not self.host:
            found["host"] = N_("required")
        if not self.username:
            found["username"] = N_("required")
        if not self.password and not self.private_key:
            found["password"] = N_("give a password or a private key")
        if not self.host_key:
            found["host_key"] = N_("required: pin the server's host key before the first "
                                   "connection")
        return found

    @property
    def where(self) -> str:
        return f"{self.username}@{self.host}:{self.port}"

    def cache_key(self) -> tuple:
        """Equal for equal descriptions; secrets only as a digest."""
        secret = hashlib.sha256("\x00".join(
            v or "" for v in (self.password, self.private_key, self.passphrase)).encode())
        return (self.host, self.port, self.username, self.host_key, secret.hexdigest(),
                self.connect_timeout, self.operation_timeout, self.keepalive)


# --- classifying failures --------------------------------------------------------------

def classify(exc: BaseException, doing: str = "") -> SftpError:
    """The :class:`SftpError` of a failure (module docstring)."""
    prefix = f"{doing}: " if doing else ""
    if isinstance(exc, SftpError):
        return exc
    if isinstance(exc, socket.timeout | TimeoutError):
        return SftpError("timeout", f"{prefix}no answer in time")
    if isinstance(exc, paramiko.BadHostKeyException):
        return SftpError("host_key", f"{prefix}host key mismatch")
    if isinstance(exc, paramiko.AuthenticationException):
        return SftpError("auth", f"{prefix}authentication failed: {exc}")
    if isinstance(exc, socket.gaierror):
        return SftpError("connection", f"{prefix}cannot resolve the host: {exc}")
    if isinstance(exc, EOFError | paramiko.SSHException | SFTPError):
        return SftpError("connection", f"{prefix}connection lost: {exc or 'closed'}")
    if isinstance(exc, OSError):
        code = exc.errno
        if code in (errno.EACCES, errno.EPERM):
            return SftpError("permission", f"{prefix}permission denied")
        if code == errno.ENOSPC:
            return SftpError("no_space", f"{prefix}no space left on the server")
        if code in _NETWORK_ERRNOS or isinstance(exc, ConnectionError):
            return SftpError("connection", f"{prefix}{exc.strerror or exc}")
        if code == errno.ENOENT:
            return SftpError("remote", f"{prefix}no such file or directory")
        if code is None and "closed" in str(exc).lower():  # paramiko: "Socket is closed"
            return SftpError("connection", f"{prefix}connection lost: {exc}")
        text = exc.strerror or (exc.args[0] if exc.args else "") or type(exc).__name__
        return SftpError("remote", f"{prefix}the server said: {text}")
    return SftpError("connection", f"{prefix}{type(exc).__name__}: {exc}")


# --- connecting ------------------------------------------------------------------------

def _transport(host: str, port: int, timeout: float, key_type: str | None
               ) -> paramiko.Transport:
    """A transport after the key exchange (nothing of ours sent but the handshake)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise classify(exc, f"cannot connect to {host}:{port}") from None
    transport = paramiko.Transport(sock)
    transport.banner_timeout = transport.handshake_timeout = timeout
    transport.auth_timeout = timeout
    if key_type:
        wanted = _ALGORITHMS.get(key_type, [key_type])
        offered = [k for k in wanted if k in transport.get_security_options().key_types]
        transport.get_security_options().key_types = offered or wanted
    try:
        transport.start_client(timeout=timeout)
    except Exception as exc:
        transport.close()
        if key_type and isinstance(exc, paramiko.SSHException) \
                and "host key" in str(exc).lower():
            # the server has no key of the pinned type at all: another server, or
            # one re-installed with other keys
            raise SftpError("host_key", f"host key mismatch: {host}:{port} offers no "
                            f"{key_type} key, the pinned one's type; nothing was sent"
                            ) from None
        raise classify(exc, f"SSH handshake with {host}:{port}") from None
    return transport


def fetch_host_key(host: str, port: int = 22, timeout: float = 15.0) -> HostKey:
    """The host key the server at ``host:port`` offers now (the operator's "fetch":
    shown for confirmation, never trusted on its own); SftpError when unreachable."""
    transport = _transport(host, port, timeout, None)
    try:
        return HostKey.of(transport.get_remote_server_key())
    finally:
        transport.close()


class _Client(paramiko.SFTPClient):
    """paramiko's SFTP client keeping the extensions the server names in its VERSION
    packet (paramiko reads and drops them)."""

    extensions: dict[str, bytes]

    def _send_version(self):
        message = Message()
        message.add_int(3)
        self._send_packet(CMD_INIT, message)
        kind, data = self._read_packet()
        if kind != CMD_VERSION:
            raise SFTPError("Incompatible sftp protocol")
        (version,) = struct.unpack(">I", data[:4])
        self.extensions, at = {}, 4
        while at + 4 <= len(data):
            (n,) = struct.unpack(">I", data[at:at + 4])
            name = data[at + 4:at + 4 + n]
            at += 4 + n
            (m,) = struct.unpack(">I", data[at:at + 4]) if at + 4 <= len(data) else (0,)
            self.extensions[name.decode("ascii", "replace")] = data[at + 4:at + 4 + m]
            at += 4 + m
        return version


@dataclass(frozen=True)
class RemoteEntry:
    """A directory entry: ``name``, ``size``, ``mtime`` (seconds), ``is_file``."""

    name: str
    size: int
    mtime: int
    is_file: bool


class Connection:
    """An authenticated SSH transport with an SFTP session; see the module docstring.
    Use through :data:`POOL` (one thread at a time: the pool's lock)."""

    def __init__(self, endpoint: Endpoint) -> None:
        problems = endpoint.problems()
        if problems:
            raise SftpError("auth" if "password" in problems else "host_key",
                            "; ".join(f"{k} {v}" for k, v in problems.items()))
        try:
            pinned = HostKey.parse(endpoint.host_key or "")
        except ValueError as exc:
            raise SftpError("host_key", f"the pinned host key is unusable: {exc}") from None
        self.endpoint = endpoint
        transport = _transport(endpoint.host, endpoint.port, endpoint.connect_timeout,
                               pinned.type)
        try:
            offered = HostKey.of(transport.get_remote_server_key())
            if offered != pinned:
                raise SftpError("host_key", f"host key mismatch: {endpoint.host}:"
                                f"{endpoint.port} offered {offered.fingerprint}, pinned "
                                f"is {pinned.fingerprint}; nothing was sent")
            self._authenticate(transport)
            if endpoint.keepalive:
                transport.set_keepalive(endpoint.keepalive)
            self.sftp = self._open_sftp(transport)
        except BaseException as exc:
            if isinstance(exc, paramiko.AuthenticationException) and (
                    not transport.is_active()):
                # paramiko reports a server that went away during the login as an
                # authentication failure ("transport shut down or saw EOF"): it is a
                # lost connection, retried as one, not a refused login.
                exc = EOFError(f"the server closed the connection during the login "
                               f"({exc})")
            transport.close()
            if isinstance(exc, Exception):
                raise classify(exc, f"connecting to {endpoint.where}") from None
            raise
        self.transport = transport
        #: directories this connection made or found (the writer skips their check)
        self.known_dirs: set[str] = set()
        self.last_used = time.monotonic()
        self.lock = threading.Lock()
        #: held by each operation of a poller's scan and its files (their removal runs
        #: on a thread of its own while the scan reads the next file)
        self.ops = threading.RLock()

    def _authenticate(self, transport: paramiko.Transport) -> None:
        endpoint = self.endpoint
        if endpoint.private_key:
            try:
                key = load_private_key(endpoint.private_key, endpoint.passphrase)
            except ValueError as exc:
                raise SftpError("auth", str(exc)) from None
            try:
                transport.auth_publickey(endpoint.username, key)
                return
            except paramiko.AuthenticationException:
                if not endpoint.password:
                    raise
        transport.auth_password(endpoint.username, endpoint.password or "")

    def _open_sftp(self, transport: paramiko.Transport) -> _Client:
        channel = transport.open_session(timeout=self.endpoint.connect_timeout)
        channel.settimeout(self.endpoint.operation_timeout)
        channel.invoke_subsystem("sftp")
        return _Client(channel)

    @property
    def alive(self) -> bool:
        return self.transport.is_active()

    def close(self) -> None:
        try:
            self.sftp.close()
        finally:
            self.transport.close()

    @contextmanager
    def side_session(self) -> Iterator[_Client]:
        """A second SFTP session on the same transport (a probe beside an upload)."""
        client = self._open_sftp(self.transport)
        try:
            yield client
        finally:
            client.close()

    # --- operations (a poller's and the writer's) ------------------------------------
    def stat(self, path: str) -> paramiko.SFTPAttributes | None:
        """The attributes at ``path`` (not following a link), None when nothing is."""
        try:
            return self.sftp.lstat(path)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise

    def listdir(self, path: str) -> list[RemoteEntry]:
        """Every entry of a directory with its size and mtime."""
        return [RemoteEntry(a.filename, a.st_size or 0, a.st_mtime or 0,
                            stat.S_ISREG(a.st_mode or 0))
                for a in self.sftp.listdir_attr(path)]

    def open_read(self, path: str, prefetch: bool = True) -> IO[bytes]:
        """``path`` opened for a streaming read (read-ahead on)."""
        handle = self.sftp.open(path, "rb", bufsize=1 << 15)
        if prefetch:
            handle.prefetch()
        return handle

    def write_stream(self, path: str, stream: IO[bytes], window: int = WRITE_WINDOW,
                     remote: paramiko.SFTPFile | None = None) -> int:
        """Create ``path`` (or take ``remote``, the file opened already) and write
        ``stream`` into it; its size. Writes of 32 KiB go ahead of their answers, at
        most ``window`` of them in flight (1 MiB in memory whatever the file's size),
        and every answer is checked before the file is closed: paramiko's own pipelined
        writes drop a failed write's status (ENOSPC halfway would leave a short file,
        or a hole), so the requests are sent here with the file as the receiver of
        their answers, which keeps the first error."""
        sftp = self.sftp
        remote = remote if remote is not None else sftp.open(path, "wb")
        try:
            offset, in_flight = 0, 0
            while chunk := stream.read(WRITE_REQUEST * 32):
                view = memoryview(chunk)
                for start in range(0, len(view), WRITE_REQUEST):
                    piece = view[start:start + WRITE_REQUEST]
                    sftp._async_request(remote, CMD_WRITE, remote.handle,
                                        int64(offset), bytes(piece))
                    offset += len(piece)
                    in_flight += 1
                    while in_flight >= window:
                        sftp._read_response()
                        in_flight -= 1
                        remote._check_exception()
            sftp._finish_responses(remote)  # every answer read; the first error raised
            remote._check_exception()
        finally:
            remote.close()
        return offset

    def makedirs(self, path: str) -> None:
        """``path`` and its missing parents made (an existing one is fine)."""
        if path in ("", "/"):
            return
        found = self.stat(path)
        if found is not None:
            if not stat.S_ISDIR(found.st_mode or 0):
                raise SftpError("remote", f"{path} exists and is not a directory")
            return
        self.makedirs(posixpath.dirname(path.rstrip("/")))
        try:
            self.sftp.mkdir(path)
        except OSError:
            found = self.stat(path)  # made meanwhile by another worker
            if found is None or not stat.S_ISDIR(found.st_mode or 0):
                raise

    @property
    def posix_rename(self) -> bool:
        return "posix-rename@openssh.com" in self.sftp.extensions

    def rename(self, old: str, new: str, overwrite: bool) -> bool:
        """Move ``old`` to ``new``. Without ``overwrite`` the plain SFTP rename, which
        never replaces a file (False when ``new`` exists). With it, the atomic
        ``posix-rename@openssh.com`` where the server offers it; elsewhere the old file
        is removed first (docs/sftp.md: a moment with no file under the name, never a
        partial one)."""
        if not overwrite:
            try:
                self.sftp.rename(old, new)
                return True
            except OSError:
                if self.stat(new) is not None:
                    return False
                raise
        if self.posix_rename:
            self.sftp.posix_rename(old, new)
            return True
        try:
            self.sftp.rename(old, new)
        except OSError:
            if self.stat(new) is None:
                raise
            self.sftp.remove(new)
            self.sftp.rename(old, new)
        return True

    def remove(self, path: str) -> bool:
        """Remove a file; False when it was gone already."""
        try:
            self.sftp.remove(path)
            return True
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise

    def free_bytes(self, path: str) -> int | None:
        """The bytes free to us on the file system of ``path`` (``statvfs@openssh.com``),
        None where the server does not say."""
        if "statvfs@openssh.com" not in self.sftp.extensions:
            return None
        try:
            _kind, msg = self.sftp._request(CMD_EXTENDED, "statvfs@openssh.com", path)
        except Exception:
            return None
        _bsize, frsize, _blocks, _bfree, bavail = (msg.get_int64() for _ in range(5))
        return frsize * bavail


def probe_directory(endpoint: Endpoint, directory: str, make: bool = False) -> bool:
    """An instance's probe: connect (a connection of its own, closed after) and look at
    ``directory`` (made when missing with ``make``); True, or SftpError saying why not."""
    conn = Connection(endpoint)
    try:
        found = conn.stat(directory)
        if found is None and make:
            conn.makedirs(directory)
        elif found is None:
            raise SftpError("remote", f"{directory} does not exist")
        elif not stat.S_ISDIR(found.st_mode or 0):
            raise SftpError("remote", f"{directory} is not a directory")
        return True
    except SftpError:
        raise
    except Exception as exc:
        raise classify(exc, f"looking at {directory}") from None
    finally:
        conn.close()


# --- the per-process pool ----------------------------------------------------------------

class Pool:
    """One connection per (owner, endpoint) in this process (module docstring)."""

    def __init__(self, reap_every: float = 5.0) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple, Connection] = {}
        self._pid = os.getpid()
        self._reaper: threading.Thread | None = None
        self._reap_every = reap_every
        self.opened = 0  # connections made by this process (tests, benches)

    @contextmanager
    def connection(self, owner: str, endpoint: Endpoint, fresh: bool = False
                   ) -> Iterator[tuple[Connection, bool]]:
        """(the kept connection, whether it was reused), held for the block; a failure
        in the block that is a connection loss drops it."""
        key = (owner, endpoint.cache_key())
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's are not ours
                self._kept, self._pid, self._reaper = {}, os.getpid(), None
            kept = self._kept.pop(key, None) if fresh else self._kept.get(key)
            if kept is not None and not kept.alive:
                self._kept.pop(key, None)
                kept = None
        if fresh and kept is not None:
            _close_quietly(kept)
            kept = None
        reused = kept is not None
        if kept is None:
            kept = Connection(endpoint)
            with self._lock:
                self.opened += 1
                old = self._kept.get(key)
                self._kept[key] = kept
                self._start_reaper()
            if old is not None and old is not kept:
                _close_quietly(old)
        with kept.lock:
            try:
                yield kept, reused
            except BaseException as exc:
                # a connection that failed is dropped; one that said no (permission,
                # no space) or whose caller failed for its own reasons (a payload that
                # cannot be read) stays
                if (isinstance(exc, SftpError) and exc.error_class in (
                        "connection", "timeout", "host_key")) or not kept.alive:
                    self.discard(owner, endpoint, kept)
                raise
            finally:
                kept.last_used = time.monotonic()

    def discard(self, owner: str, endpoint: Endpoint, which: Connection | None = None
                ) -> None:
        key = (owner, endpoint.cache_key())
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and (which is None or kept is which):
                del self._kept[key]
            elif which is None:
                return
            else:
                kept = which
        _close_quietly(kept)

    def kept(self) -> int:
        with self._lock:
            return len(self._kept)

    def close_idle(self, now: float | None = None) -> int:
        """Close the connections unused for their ``idle_close`` seconds; how many."""
        now = time.monotonic() if now is None else now
        idle = []
        with self._lock:
            for key, kept in list(self._kept.items()):
                if now - kept.last_used >= kept.endpoint.idle_close \
                        and kept.lock.acquire(blocking=False):
                    del self._kept[key]
                    idle.append(kept)
        for kept in idle:
            kept.lock.release()
            _close_quietly(kept)
        return len(idle)

    def close_all(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for one in kept:
            _close_quietly(one)

    def _start_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap, name="sftp-idle",
                                            daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        while True:
            time.sleep(self._reap_every)
            self.close_idle()
            with self._lock:
                if not self._kept:
                    self._reaper = None
                    return


def _close_quietly(connection: Connection) -> None:
    try:
        connection.close()
    except Exception:
        pass


POOL = Pool()
