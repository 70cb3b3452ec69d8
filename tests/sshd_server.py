"""A real OpenSSH server on loopback for the SFTP tests and benches.

Debian's ``openssh-server`` (``/usr/sbin/sshd`` and ``/usr/lib/openssh/sftp-server``),
installed with apt-get when missing, runs in the foreground (``-D -e``) with a
configuration file of its own (``-f``) on a free loopback port, with host keys
generated for it. It logs in one test user (:data:`USER`, made with ``useradd`` and given
:data:`PASSWORD` with ``chpasswd`` when missing; ``UsePAM no``, so sshd checks the
password against ``/etc/shadow`` itself) by password or by a key listed in the server's
own ``authorized_keys`` file. Files go below :attr:`SshServer.root`, a directory of the
server's own owned by the test user (``/tmp/pytest-of-root`` is closed to other users,
so it lives directly below ``/tmp``).

``stop()`` and ``start()`` take the server down and up again on the same port with the
same host key (an outage); ``new_host_key()`` gives it another one (an impostor, or a
re-installed server).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.procs import free_port

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
USER = "b2bsftp"
PASSWORD = "b2bhub-test-password"


def ensure_openssh() -> None:
    """Install Debian's openssh-server when sshd or sftp-server is missing."""
    if os.path.exists(SSHD) and os.path.exists(SFTP_SERVER):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(["apt-get", "install", "-y", "openssh-server"], env=env).returncode:
        subprocess.run(["apt-get", "update"], env=env, check=True)
        subprocess.run(["apt-get", "install", "-y", "openssh-server"], env=env, check=True)


def ensure_user() -> pwd.struct_passwd:
    """The test user, made when missing; its password set each time (cheap)."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/bin/sh", USER], check=True)
        entry = pwd.getpwnam(USER)
    subprocess.run(["chpasswd"], input=f"{USER}:{PASSWORD}\n", text=True, check=True)
    return entry


def keygen(path: Path, kind: str, bits: int | None = None, passphrase: str = "") -> Path:
    """An OpenSSH key pair at ``path`` (private) and ``path.pub``."""
    cmd = ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", f"b2bhub-test-{kind}",
           "-f", str(path)]
    if bits:
        cmd += ["-b", str(bits)]
    subprocess.run(cmd, check=True)
    return path


class SshServer:
    """One sshd on ``127.0.0.1:port``; see the module docstring."""

    def __init__(self, work: Path, host_key_type: str = "ed25519") -> None:
        ensure_openssh()
        self.user = ensure_user()
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation
        self.port = free_port()
        self.host_key_type = host_key_type
        self.host_key_path = self.work / "host_key"
        keygen(self.host_key_path, host_key_type)
        # sshd reads it as the user, who cannot enter pytest's directories
        self.keys_dir = Path(tempfile.mkdtemp(prefix="b2bhub-sshd-keys-", dir="/tmp"))
        os.chmod(self.keys_dir, 0o755)
        self.authorized_keys = self.keys_dir / "authorized_keys"
        self.authorized_keys.write_text("")
        os.chmod(self.authorized_keys, 0o644)
        self.root = Path(tempfile.mkdtemp(prefix="b2bhub-sftp-", dir="/tmp"))
        os.chmod(self.root, 0o755)
        os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.config = self.work / "sshd_config"
        self.log = self.work / "sshd.log"
        self.process: subprocess.Popen | None = None
        self._write_config()
        self.start()

    # --- the server -------------------------------------------------------------------
    def _write_config(self) -> None:
        self.config.write_text(f"""\
ListenAddress 127.0.0.1:{self.port}
HostKey {self.host_key_path}
PidFile none
UsePAM no
PasswordAuthentication yes
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
AllowUsers {USER}
AuthorizedKeysFile {self.authorized_keys}
StrictModes no
MaxStartups 100:30:200
MaxSessions 50
LoginGraceTime 30
ClientAliveInterval 0
Subsystem sftp {SFTP_SERVER}
LogLevel VERBOSE
""")

    def start(self) -> None:
        """Start sshd and wait until it answers with its banner."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)],
                                            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(64).startswith(b"SSH-2.0-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not answer on port {self.port}")

    def stop(self) -> None:
        """Stop the listener and every session it started (an outage), and no other
        server's: the two backends' suites run side by side with servers of the same
        user, and killing that user's sessions cut the other suite's transfers."""
        if self.process is None:
            return
        sessions = _descendants(self.process.pid)  # before they lose their parent
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.process = None
        # sessions are processes of their own (sshd: user [priv], sftp-server): end them
        for pid in sessions + [p for p in _descendants_of(sessions) if p not in sessions]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.keys_dir, ignore_errors=True)

    def new_host_key(self) -> None:
        """Replace the host key (same type) and restart."""
        self.stop()
        for path in (self.host_key_path, self.host_key_path.with_suffix(".pub")):
            path.unlink()
        keygen(self.host_key_path, self.host_key_type)
        self.start()

    # --- what tests need of it ---------------------------------------------------------
    @property
    def host_key(self) -> str:
        """The public host key as ``ssh-ed25519 AAAA...`` (what an operator pastes)."""
        return " ".join(Path(f"{self.host_key_path}.pub").read_text().split()[:2])

    def fingerprint(self) -> str:
        """``SHA256:...`` as ssh-keygen prints it."""
        out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f",
                              f"{self.host_key_path}.pub"], capture_output=True, text=True,
                             check=True).stdout
        return out.split()[1]

    def authorize(self, public_key_path: Path) -> None:
        with open(self.authorized_keys, "a") as fh:
            fh.write(Path(public_key_path).read_text().strip() + "\n")

    def directory(self, name: str, mode: int = 0o755, owner: str | None = None) -> Path:
        """A directory below the root, owned by the test user (or root: ``owner="root"``,
        which the test user cannot write into)."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
        if owner != "root":
            os.chown(path, self.user.pw_uid, self.user.pw_gid)
        return path

    def connection(self, **more) -> dict:
        """An instance's connection fields for this server, by password."""
        return {"host": "127.0.0.1", "port": self.port, "username": USER,
                "password": PASSWORD, "host_key": self.host_key, **more}


def _children() -> dict[int, list[int]]:
    """Every process's children, read from /proc."""
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        found.setdefault(ppid, []).append(int(entry))
    return found


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, parents before their children."""
    return _descendants_of([pid])


def _descendants_of(pids: list[int]) -> list[int]:
    children, out, todo = _children(), [], list(pids)
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out
