"""How long ``b2bhub run`` takes to stop (issue 20: under 3 s, no SIGKILL), with event
streams open, from the signal to the exit of the whole hub (web, workers, beat).

    python bench/stop_time.py --backend embedded postgres --rounds 3 --streams 3
    python bench/stop_time.py --group

Each round starts the hub on a fresh database (migrated by ``b2bhub run`` itself) in a
process group of its own, waits until every child is ready, opens ``--streams`` event
streams, signals and times until every process of the group is gone; a round whose
output names SIGKILL, or whose streams did not end, fails. By default ``b2bhub run``
alone gets SIGTERM (a service manager's stop); ``--group`` sends SIGINT to every process
of the group at once, as a terminal's Ctrl-C does (issue 37: under 5 s).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from benchlib import ROOT, environment, free_port, fresh_backend, print_table

BIN = Path(sys.executable).parent  # the venv the bench runs in


def wait_in(path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise SystemExit(f"not seen in {timeout:.0f} s: {text!r}\n{path.read_text()[-3000:]}")


def group_left(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still there (a zombie not yet reaped
    included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def one_round(backend, streams: int, group: bool = False) -> float:
    port = free_port()
    log = os.path.join(backend.data_dir, f"hub-{port}.log")
    env = {**backend.env(), "B2BHUB_PORT": str(port), "B2BHUB_WORKERS": "1",
           "B2BHUB_LOG_LEVEL": "info"}
    logpath = Path(log)
    with open(log, "wb") as out:
        hub = subprocess.Popen([str(BIN / "b2bhub"), "run"], cwd=ROOT, env=env,
                               stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    for text in ("started beat", " ready.", "beat: schedule open, agent running"):
        wait_in(logpath, text, 120)
    made = subprocess.run([str(BIN / "b2bhub"), "token", "create", "bench",
                           "--role", "viewer"], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    headers = {"Authorization": f"Bearer {made.stdout.strip()}"}
    ended: list[float] = []

    def listen():
        with requests.get(f"http://127.0.0.1:{port}/api/v1/events", headers=headers,
                          stream=True, timeout=60) as answer:
            for _ in answer.iter_content(chunk_size=None):
                pass
        ended.append(time.monotonic())

    readers = [threading.Thread(target=listen, daemon=True) for _ in range(streams)]
    for reader in readers:
        reader.start()
    time.sleep(1.0)
    started = time.monotonic()
    if group:
        os.killpg(hub.pid, signal.SIGINT)
    else:
        hub.send_signal(signal.SIGTERM)
    status = hub.wait(60)
    while group_left(hub.pid) and time.monotonic() - started < 60:
        time.sleep(0.02)
    took = time.monotonic() - started
    for reader in readers:
        reader.join(5)
    output = logpath.read_text(errors="replace")
    if status != 0 or "SIGKILL" in output or len(ended) != streams:
        raise SystemExit(f"round failed: exit {status}, {len(ended)}/{streams} streams "
                         f"ended\n{output[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", nargs="+", default=["embedded"],
                        choices=["embedded", "postgres"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--group", action="store_true",
                        help="SIGINT to every process of the hub's group at once (a "
                             "terminal's Ctrl-C) instead of SIGTERM to b2bhub run")
    args = parser.parse_args()
    goal = 5 if args.group else 3
    print_table("environment", ["what", "value"], [list(r) for r in environment(args.backend)])
    rows = []
    for name in args.backend:
        times = []
        for _ in range(args.rounds):
            with fresh_backend(name) as backend:
                times.append(one_round(backend, args.streams, args.group))
        rows.append([name, args.streams, ", ".join(f"{t:.2f}" for t in times),
                     f"{statistics.median(times):.2f}", "yes" if max(times) < goal else "no"])
    how = ("SIGINT to the whole group" if args.group else "SIGTERM to b2bhub run")
    print_table(f"stop of b2bhub run with open event streams: seconds from the {how} "
                "until every process is gone",
                ["backend", "streams", "rounds", "median", f"every round under {goal} s"],
                rows)
    print("load average after:", ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
