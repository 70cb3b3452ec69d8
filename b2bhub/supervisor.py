"""``b2bhub run``: web, worker(s) and beat as child processes, stopped together.

A Procfile runner in a few lines: SIGINT/SIGTERM go to every child (workers then stop
claiming and settle what runs); if one child dies the others are stopped too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Supervisor:
    def __init__(self, commands: dict[str, list[str]], cwd: Path = ROOT):
        self.commands, self.cwd = commands, cwd
        self.children: dict[str, subprocess.Popen] = {}
        self.stopping = False

    @classmethod
    def for_config(cls, cfg, workers: int) -> Supervisor:
        bindir = Path(sys.executable).parent
        commands = {"web": [str(bindir / "gunicorn"), "--worker-class", "gthread",
                            "--workers", "1", "--threads",
                            str(cfg["WEB_THREADS"]), "--bind", f"{cfg['HOST']}:{cfg['PORT']}",
                            "--graceful-timeout", "10", "wsgi:app"]}
        celery = [str(bindir / "celery"), "-A", "b2bhub.worker"]
        for i in range(1, workers + 1):
            commands[f"worker{i}"] = celery + ["worker", "--pool", "solo", "-n",
                                               f"worker{i}@%h", "--loglevel", "INFO",
                                               "-Q", cfg["WORKER_QUEUES"]]
        commands["beat"] = celery + ["beat", "--loglevel", "INFO", "-s",
                                     f"{cfg['DATA_DIR']}/celerybeat-schedule"]
        return cls(commands)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for name, cmd in self.commands.items():
            self.children[name] = subprocess.Popen(cmd, cwd=self.cwd, env=os.environ.copy())
            print(f"b2bhub: started {name} (pid {self.children[name].pid})", flush=True)
        while not self.stopping:
            for name, child in self.children.items():
                if child.poll() is not None:
                    print(f"b2bhub: {name} exited with {child.returncode}; stopping",
                          flush=True)
                    self.stopping = True
                    break
            time.sleep(0.5)
        return self._stop_all()

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def _stop_all(self, timeout: float = 30.0) -> int:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in self.children.values():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        return 0
