"""Real worker, beat and web processes for tests, always stopped afterwards.

Every process gets the test backend's database, broker and data directory through the
``B2BHUB_*`` variables and finds the test plugins through their entry points
(``tests/plugin_dist`` on ``PYTHONPATH``). Output goes to a log file per process;
:meth:`Processes.print_logs` shows them when a test fails. Processes run in sessions of
their own, so a signal meant for one never reaches pytest.

Use through a fixture whose teardown calls :meth:`Processes.stop_all` and that hands
over the test app's payload directory; a fixture named ``procs`` also gets its logs into
a failing test's report (see ``conftest.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIST = ROOT / "tests" / "plugin_dist"
BIN = Path(sys.executable).parent
CELERY = [str(BIN / "celery"), "-A", "b2bhub.runtime.worker"]


class Proc:
    """One child process and its log file."""

    url: str = ""  # the web process's base URL
    #: how to tell it is ready: (check, timeout, what), for :meth:`wait_ready`
    readiness: tuple[Callable[[], bool], float, str] | None = None

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path,
                 cwd: Path = ROOT):
        self.name, self.cmd, self.log = name, cmd, log
        self._fh = open(log, "ab")  # noqa: SIM115  (closed in stop())
        self.popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self._fh,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        self.pid = self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until it is true; fail naming the process if it dies first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}) before "
                                   f"{what}:\n{self.output()[-4000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not {what} within {timeout} s:\n"
                           f"{self.output()[-4000:]}")

    def wait_ready(self) -> None:
        """Wait until it is ready as its kind says: a worker or beat logging that it
        started, a web process serving its health check."""
        if self.readiness is not None:
            self.wait_for(*self.readiness)
            self.readiness = None

    def wait_in_log(self, text: str, timeout: float = 30.0) -> None:
        self.wait_for(lambda: text in self.output(), timeout, f"logging {text!r}")

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if the process still runs after ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL of its whole process group as the last resort."""
        if self.alive():
            self.signal(signal.SIGTERM)
            if self.wait_exit(timeout) is None:
                self._kill_group()
        else:
            self._kill_group()  # children a dead parent may have left (gunicorn's worker)
        self._fh.close()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.wait_exit(10)


class Processes:
    """Starts worker, beat and web processes against the test backend."""

    def __init__(self, backend: dict, tmp: Path, payload_dir: str | None = None):
        """``payload_dir``: the payload store the test process writes (the test app's
        ``PAYLOAD_DIR``), so the processes read what it stored; by default the one in
        the backend's data directory."""
        self.backend, self.tmp = backend, tmp
        self.payload_dir = payload_dir or str(Path(backend["data_dir"]) / "payloads")
        self.procs: list[Proc] = []
        self._count = 0

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("B2BHUB_")}
        env.update({
            "B2BHUB_DATABASE_URL": self.backend["database_url"],
            "B2BHUB_BROKER_URL": self.backend["broker_url"],
            "B2BHUB_DATA_DIR": self.backend["data_dir"],
            "B2BHUB_PAYLOAD_DIR": self.payload_dir,
            "B2BHUB_LOG_LEVEL": "info",
            "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIST), str(ROOT)]),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(extra or {})
        return env

    def start(self, name: str, cmd: list[str], extra_env: dict[str, str] | None = None
              ) -> Proc:
        self._count += 1
        log = self.tmp / f"{self._count:02d}-{name}.log"
        proc = Proc(name, cmd, self.env(extra_env), log)
        self.procs.append(proc)
        return proc

    def worker(self, extra_env: dict[str, str] | None = None, include: str | None = None,
               wait: bool = True, queues: str = "deliveries,default") -> Proc:
        """``celery worker --pool solo`` on ``queues``: wake-ups come on ``deliveries``;
        the sweep, the source scheduler and the scans of pollers on ``default``."""
        n = sum(p.name.startswith("worker") for p in self.procs) + 1
        cmd = CELERY + ["worker", "--pool", "solo", "-n", f"w{n}@%h", "--loglevel", "INFO",
                        "-Q", queues, "--without-mingle", "--without-gossip"]
        if include:
            cmd += ["--include", include]
        proc = self.start(f"worker{n}", cmd, extra_env)
        _ready_when_logged(proc, " ready.")
        if wait:
            proc.wait_ready()
        return proc

    def beat(self, extra_env: dict[str, str] | None = None, wait: bool = True) -> Proc:
        """``celery beat`` with a schedule file of its own; the sweep runs every 5 s.
        ``wait=False``: started, not waited for (:meth:`Proc.wait_ready` does)."""
        cmd = CELERY + ["beat", "--loglevel", "INFO", "-s", str(self.tmp / "beat-schedule")]
        proc = self.start("beat", cmd, extra_env)
        _ready_when_logged(proc, "beat: schedule open, agent running")
        if wait:
            proc.wait_ready()
        return proc

    def web(self, threads: int = 16, extra_env: dict[str, str] | None = None,
            workers: int = 1, wait: bool = True) -> Proc:
        """gunicorn serving ``wsgi:app`` on a free loopback port (``proc.url``) with the
        Procfile's settings module, so a stop ends the open event streams first as in
        production (without it each stop with a live page open waited the whole graceful
        timeout); ``threads - 4`` event streams at once per worker process.
        ``wait=False``: started, not waited for (:meth:`Proc.wait_ready` does), so that
        the processes a test needs spend their seconds of start-up (imports above all)
        at the same time."""
        port = free_port()
        cmd = [str(BIN / "gunicorn"), "-c", "python:b2bhub.runtime.gunicorn_conf",
               "--worker-class", "gthread", "--workers", str(workers),
               "--threads", str(threads), "--bind", f"127.0.0.1:{port}",
               "--graceful-timeout", "5", "wsgi:app"]
        proc = self.start("web", cmd, {"B2BHUB_WEB_THREADS": str(threads), **(extra_env or {})})
        proc.url = f"http://127.0.0.1:{port}"
        proc.readiness = (lambda: _healthy(proc.url), 60, "serving /api/v1/health")
        if wait:
            proc.wait_ready()
        return proc

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``b2bhub ARGS`` in a process of its own, with the same environment."""
        return subprocess.run([str(BIN / "b2bhub"), *args], cwd=ROOT, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def stop_all(self) -> None:
        """SIGTERM every process at once, then wait for each (SIGKILL as the last
        resort); never raises."""
        for proc in self.procs:
            try:
                proc.signal(signal.SIGTERM)
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                print(f"could not stop {proc.name}: {exc}")

    def logs(self, tail: int = 6000) -> str:
        """The end of every process's log, for a failing test's report."""
        return "\n".join(f"===== {p.name} (pid {p.pid}) {p.log} =====\n{p.output()[-tail:]}"
                         for p in self.procs)


def wait_until(check: Callable[[], object], timeout: float, what: str,
               every: float = 0.2) -> object:
    """Poll ``check`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout} s (last: {value!r})")
        time.sleep(every)


def _ready_when_logged(proc: Proc, text: str, timeout: float = 60) -> None:
    proc.readiness = (lambda: text in proc.output(), timeout, f"logging {text!r}")


def free_port() -> int:
    """A free loopback port; within ``B2BHUB_TEST_PORTS`` (``first-last``) when set."""
    wanted = os.environ.get("B2BHUB_TEST_PORTS", "")
    candidates = [0]
    if wanted:
        first, _, last = wanted.partition("-")
        candidates = list(range(int(first), int(last or first) + 1))
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError(f"no free port in B2BHUB_TEST_PORTS={wanted}")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
