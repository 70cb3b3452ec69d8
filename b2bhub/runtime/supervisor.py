"""``b2bhub run``: web, worker(s) and beat as child processes, stopped together.

A Procfile runner in a few lines: SIGINT/SIGTERM go to every child (workers then stop
claiming and settle what runs); if one child dies the others are stopped too.

Exit status, for a service manager that restarts on failure: 0 after a stop that was
asked for (SIGINT, SIGTERM), whatever the children answered it with. When a child ends
on its own, the others are stopped and ``b2bhub run`` fails: with the child's own exit
code when it exited with one, 128 + the signal number when a signal killed it (as a
shell reports it: 137 for SIGKILL), 1 when it exited with 0 although nobody stopped it.
Its output names the child, its pid and how it ended.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class Supervisor:
    """``cwd``: where the children run; by default where ``b2bhub run`` was started, so a
    relative path (the default data directory ``./var``) means the same to every
    process, wherever the hub is installed."""

    def __init__(self, commands: dict[str, list[str]], cwd: Path | None = None):
        self.commands, self.cwd = commands, cwd
        self.children: dict[str, subprocess.Popen] = {}
        self.stopping = False
        self.failure = 0  # the exit status a child's own end calls for

    @classmethod
    def for_config(cls, cfg, workers: int) -> Supervisor:
        bindir = Path(sys.executable).parent
        # the Procfile's settings (b2bhub.runtime.gunicorn_conf: its SIGTERM ends event streams
        # first), with the address, processes and threads of this configuration
        commands = {"web": [str(bindir / "gunicorn"),
                            "--config", "python:b2bhub.runtime.gunicorn_conf",
                            "--workers", str(cfg["WEB_CONCURRENCY"]),
                            "--threads", str(cfg["WEB_THREADS"]),
                            "--bind", f"{cfg['HOST']}:{cfg['PORT']}", "wsgi:app"]}
        celery = [str(bindir / "celery"), "-A", "b2bhub.runtime.worker"]
        for i in range(1, workers + 1):
            commands[f"worker{i}"] = celery + ["worker", "--pool", "solo", "-n",
                                               f"worker{i}@%h", "--loglevel", "INFO",
                                               "-Q", cfg["WORKER_QUEUES"]]
        commands["beat"] = celery + ["beat", "--loglevel", "INFO", "-s",
                                     f"{cfg['DATA_DIR']}/celerybeat-schedule"]
        return cls(commands)

    def run(self) -> int:
        # this process loaded the app to migrate: out of the collector's sight, its exit
        # does not walk those objects again (see b2bhub.runtime.tasks._freeze_startup_objects)
        gc.freeze()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for name, cmd in self.commands.items():
            self.children[name] = subprocess.Popen(cmd, cwd=self.cwd, env=os.environ.copy())
            print(f"b2bhub: started {name} (pid {self.children[name].pid})", flush=True)
        while not self.stopping:
            for name, child in self.children.items():
                if child.poll() is not None:
                    self.failure = failure_status(child.returncode)
                    print(f"b2bhub: {name} (pid {child.pid}) {how_it_ended(child.returncode)}"
                          f"; stopping the others, exit status {self.failure}",
                          file=sys.stderr, flush=True)
                    self.stopping = True
                    break
            time.sleep(0.5)
        self._stop_all()
        return self.failure

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def _stop_all(self, timeout: float = 30.0) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, child in self.children.items():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"b2bhub: {name} (pid {child.pid}) still running {timeout:.0f} s "
                      "after SIGTERM; killed", file=sys.stderr, flush=True)
                child.kill()
                child.wait()


def how_it_ended(returncode: int) -> str:
    """``exited with status 3``, ``was killed by SIGKILL``, ``exited with status 0``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


def failure_status(returncode: int) -> int:
    """The exit status of ``b2bhub run`` when a child ended on its own with this code."""
    if returncode < 0:
        return 128 - returncode
    return returncode or 1
