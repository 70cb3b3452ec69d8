"""Fault-injection suite: documents in under faults, checked for lost, duplicated, stuck.

    python bench/faults.py                         # every scenario, both backends
    python bench/faults.py --short                 # the CI form: a few, smaller
    python bench/faults.py --backend postgres --scenario redis-stop pg-restart

Each scenario runs the hub as real processes (gunicorn web, ``celery`` workers and beat,
as ``tests/procs.py`` starts them) on a fresh database, puts uniquely bodied documents in
through the file poller and, where it applies, AS2 from a loopback partner, injects its
fault, waits until every accepted document is delivered or the deadline passes, and
checks the side effects by body hash (``bench/faultlib.py``):

* lost: accepted, nothing in flight at the end, no file or no sink attempt for it;
* duplicated: one document as two messages (two files, two sink messages);
* repeats: one delivery attempted again after an attempt cut after its side effect
  (allowed: the writer rewrites the same file name, the sink sees the same delivery id),
  counted apart;
* stuck: still in the inbox or not final in the hub at the deadline.

Recovery is the time from the end of the fault to the last document delivered; the
longest gap is the longest time the sink saw no attempt at all once the fault began.
The PostgreSQL + Redis backend runs on servers the suite starts itself (a cluster by
``initdb``, a ``redis-server``; ``--pg-port``, ``--redis-port``), never on shared ones.
Exit status 1 when any scenario lost, duplicated or left something stuck.

Fault hooks the processes honour only when set (``b2bhub/engine/faults.py``, the clock
in ``b2bhub/models/base.py``):
``B2BHUB_FAULT_PAUSE`` (a worker pauses at a point of an attempt so it is killed there)
and ``B2BHUB_FAKE_CLOCK_FILE`` (one process's clock stepped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import benchlib
import faultlib
from faultlib import FINAL, TERMINAL_MESSAGE, Backend, Hub, Ledger
from sqlalchemy import text


@dataclass
class Sizes:
    files: int
    as2: int
    seconds: float  # how long the load is spread over
    deadline: float  # seconds after the fault for everything to be delivered
    fault: float  # how long an outage lasts


@dataclass
class Result:
    scenario: str
    backend: str
    accepted: int = 0
    refused: int = 0
    lost: int = 0
    duplicated: int = 0
    repeats: int = 0
    stuck: int = 0
    recovery: float | None = None
    gap: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.stuck)


class Run:
    """One scenario on one backend: the hub, the ledger, the load, the check."""

    def __init__(self, name: str, backend: Backend, tmp: Path, args, sizes: Sizes,
                 payload_dir: Path | None = None, servers: dict | None = None):
        self.name, self.sizes, self.args = name, sizes, args
        self.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        self.rng = random.Random(self.seed)
        self.ledger = Ledger(self.seed)
        self.hub = Hub(backend, tmp, args.lease, payload_dir)
        self.servers = servers or {}
        self.result = Result(name, backend.name)
        self.fault_started = self.fault_ended = None
        self._threads: list[threading.Thread] = []

    # the load
    def load(self, files: int | None = None, as2: int | None = None,
             seconds: float | None = None) -> None:
        """Drop ``files`` documents and send ``as2`` over ``seconds``, in threads."""
        files = self.sizes.files if files is None else files
        as2 = self.sizes.as2 if as2 is None else as2
        seconds = self.sizes.seconds if seconds is None else seconds

        def drop_files():
            for _ in range(files):
                self.hub.drop(self.ledger.new("file"))
                time.sleep(seconds / max(files, 1))

        def send_as2():
            deadline = time.monotonic() + seconds + self.sizes.deadline
            for _ in range(as2):
                self.hub.send_as2(self.ledger.new("as2"), deadline)
                time.sleep(seconds / max(as2, 1) / 2)

        for target, n in ((drop_files, files), (send_as2, as2)):
            if n:
                thread = threading.Thread(target=target, daemon=True)
                thread.start()
                self._threads.append(thread)

    def wait_load(self) -> None:
        for thread in self._threads:
            thread.join()

    def fault(self) -> _Fault:
        return _Fault(self)

    # the check
    def settle(self) -> Result:
        """Wait for the load, then until all accepted is delivered or the deadline."""
        self.wait_load()
        start = self.fault_ended or time.monotonic()
        deadline = start + self.sizes.deadline
        done_at = None
        while time.monotonic() < deadline:
            if self._all_delivered():
                done_at = time.monotonic()
                break
            time.sleep(1)
        time.sleep(2)  # a repeat or a second message arriving just after would count
        self._check()
        if done_at is not None:
            self.result.recovery = round(max(0.0, done_at - start), 1)
        return self.result

    def _all_delivered(self) -> bool:
        if self.hub.left_in_inbox():
            return False
        out = self.hub.outcome(self.ledger)
        return all(out["files"][d.digest] and out["attempts"].get(d.digest)
                   and out["posts"].get(d.digest) for d in self.ledger.accepted())

    def _check(self) -> None:
        out, view = self.hub.outcome(self.ledger), self.hub.hub_view()
        inbox = self.hub.left_in_inbox()
        r = self.result
        accepted = self.ledger.accepted()
        r.accepted = len(accepted)
        r.refused = len(self.ledger.docs) - len(accepted)
        for doc in self.ledger.docs.values():  # a refused one must not come out twice
            files, attempts = out["files"][doc.digest], out["attempts"].get(doc.digest, [])
            messages = view.get(doc.digest, [])
            posts = out["posts"].get(doc.digest, [])  # the http_poster target's
            if (files > 1 or len({m for m, _ in attempts}) > 1 or len(messages) > 1
                    or len(set(posts)) > 1):
                r.duplicated += 1
                r.notes.append(f"duplicated {doc.key}: {files} files, "
                               f"{len(messages)} messages, sink saw {attempts}, "
                               f"posts with keys {posts}")
            r.repeats += len(attempts) - len(set(attempts)) + len(posts) - len(set(posts))
            if doc.accepted_at is None or files and attempts and posts:
                continue
            in_flight = doc.name in inbox or any(
                status not in TERMINAL_MESSAGE or any(s not in FINAL for s in states)
                for status, states in messages)
            if in_flight:
                r.stuck += 1
                r.notes.append(f"stuck {doc.key}: {messages or 'still in the inbox'}")
            else:
                r.lost += 1
                r.notes.append(f"lost {doc.key}: {files} files, sink {attempts}, "
                               f"posts {posts}, hub {messages}")
        r.gap = self._longest_gap()
        refusals = sorted({why for d in self.ledger.docs.values() for why in d.refusals})
        if refusals:
            tried = sum(1 for d in self.ledger.docs.values() if d.refusals)
            r.notes.append(f"{tried} AS2 documents posted again; answers before acceptance: "
                           + "; ".join(refusals[:4]))

    def _longest_gap(self) -> float | None:
        """Longest stretch without a sink attempt, from the fault's start to the last."""
        if self.fault_started is None:
            return None
        ends = []
        offset = time.time() - time.monotonic()
        for path in self.hub.records.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                try:
                    ends.append(json.loads(line)["end"] - offset)
                except ValueError:
                    continue
        points = sorted([self.fault_started] + [e for e in ends if e >= self.fault_started])
        if len(points) < 2:
            return None
        return round(max(b - a for a, b in zip(points, points[1:], strict=False)), 1)

    def close(self) -> None:
        self.hub.stop()


class _Fault:
    """``with run.fault():`` marks when the fault began and ended."""

    def __init__(self, run: Run):
        self.run = run

    def __enter__(self):
        self.run.fault_started = time.monotonic()

    def __exit__(self, *exc):
        self.run.fault_ended = time.monotonic()


def kill9(proc) -> None:
    proc.signal(signal.SIGKILL)
    proc.wait_exit(10)
    proc._kill_group()  # gunicorn's worker, left by its killed master


# --- scenarios ----------------------------------------------------------------------------

def worker_kill9(run: Run) -> None:
    """kill -9 of one worker at three points of an attempt: a claimed batch not yet
    attempted, an attempt whose side effect is done but not settled (both held there by
    ``B2BHUB_FAULT_PAUSE``), and at a random moment of the load (mostly mid-write)."""
    hub = run.hub
    hub.start_web()
    hub.procs.beat()
    nth = run.rng.randint(3, 8)
    w1 = hub.worker({"B2BHUB_FAULT_PAUSE": f"claimed:120:{nth}"})
    w2 = hub.worker({"B2BHUB_FAULT_PAUSE": f"attempted:120:{nth}"})
    run.load()
    with run.fault():
        for proc, point in ((w1, "claimed"), (w2, "attempted")):
            proc.wait_in_log(f"fault pause at {point}", timeout=120)
            kill9(proc)
            hub.worker(wait=False)
        time.sleep(run.rng.uniform(0.5, 3))
        victim = hub.worker()
        time.sleep(run.rng.uniform(0.2, 2))
        kill9(victim)
        run.wait_load()
    run.result.notes.append(f"killed at claimed (batch {nth}), attempted (attempt {nth}), "
                            "random")


def web_kill9(run: Run) -> None:
    """kill -9 of the web process twice while the partner posts AS2 messages; the
    partner retries each with its Message-ID until it gets the MDN."""
    hub = run.hub
    hub.start_partner()
    hub.start_web()
    hub.procs.beat()
    hub.worker()
    run.load()
    with run.fault():
        for _ in range(2):
            time.sleep(run.rng.uniform(2, 5))
            kill9(hub.web)
            time.sleep(1)
            hub.start_web()
    run.wait_load()


def beat_kill9(run: Run) -> None:
    """kill -9 of beat and of the worker running a sweep, in the sweep (its guard
    taken: held there by ``B2BHUB_FAULT_PAUSE=sweeping``), twice."""
    hub = run.hub
    hub.start_web()
    beat = hub.procs.beat()
    pause = {"B2BHUB_FAULT_PAUSE": "sweeping:60:2"}
    sweeper = hub.worker(pause, queues="default")
    hub.worker(queues="deliveries")
    run.load()
    resumed, killed_at = [], 0.0
    with run.fault():
        for n in range(2):
            # on SQLite the guard of the sweep killed is a lease row (60 s): no sweep
            # runs until it expires
            sweeper.wait_in_log("fault pause at sweeping", timeout=180)
            if n:
                resumed.append(f"{time.monotonic() - killed_at:.0f} s")
            kill9(sweeper)
            kill9(beat)
            killed_at = time.monotonic()
            time.sleep(1)
            beat = hub.procs.beat()
            # the replacement is killed in its first sweep, the last one left alone
            sweeper = hub.worker({"B2BHUB_FAULT_PAUSE": "sweeping:60:1"} if not n else None,
                                 queues="default")
    run.wait_load()
    run.result.notes.append(f"the next sweep ran {resumed[0]} after the kill in a sweep")


def sigterm_storm(run: Run) -> None:
    """Every 2-4 s a worker or beat gets SIGTERM and a new one is started."""
    hub = run.hub
    hub.start_web()
    beat = hub.procs.beat()
    workers = [hub.worker(), hub.worker()]
    run.load()
    with run.fault():
        until = time.monotonic() + run.sizes.fault
        while time.monotonic() < until:
            time.sleep(run.rng.uniform(2, 4))
            if run.rng.random() < 0.2:  # the old one exits on its own, in its grace
                beat.signal(signal.SIGTERM)
                beat = hub.procs.beat()
            else:
                workers.pop(run.rng.randrange(len(workers))).signal(signal.SIGTERM)
                workers.append(hub.worker(wait=False))
    run.wait_load()


def _whole_hub_under_load(run: Run) -> None:
    """The AS2 partner, web, beat and two workers, and the documents starting to flow."""
    hub = run.hub
    hub.start_partner()
    hub.start_web()
    hub.procs.beat()
    hub.worker()
    hub.worker()
    run.load()


def redis_stop(run: Run) -> None:
    """Redis stopped for ``fault`` seconds under load, then started again (empty)."""
    redis = run.servers["redis"]
    _whole_hub_under_load(run)
    time.sleep(run.sizes.seconds / 4)
    with run.fault():
        redis.stop()
        time.sleep(run.sizes.fault)
        redis.start()
    run.result.notes.append(f"Redis down {run.sizes.fault:.0f} s, back empty")


def pg_restart(run: Run) -> None:
    """PostgreSQL restarted (``pg_ctl restart -m fast``) twice under load."""
    pg = run.servers["pg"]
    _whole_hub_under_load(run)
    with run.fault():
        for _ in range(2):
            time.sleep(run.sizes.seconds / 3)
            pg.restart()


SWEEP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Task b2bhub\.sweep"
                        r"\[[^]]+\] succeeded in ([0-9.e-]+)s: (\{.*\})$", re.M)


def two_beats(run: Run) -> None:
    """Two beats at once: twice the sweep tasks, but one sweep at a time, and no more
    wake-ups than one beat would give."""
    hub = run.hub
    hub.start_web()
    hub.procs.beat()
    second = hub.procs.start("beat2", faultlib_beat_cmd(hub, "beat2"))
    second.wait_in_log("beat: schedule open, agent running", timeout=60)
    hub.worker()
    hub.worker()
    with run.fault():
        run.load()
        run.wait_load()
        time.sleep(run.sizes.fault)
    run.settle_hook = lambda: _sweep_overlaps(run)


def faultlib_beat_cmd(hub: Hub, name: str) -> list[str]:
    from tests.procs import CELERY
    return CELERY + ["beat", "--loglevel", "INFO", "-s", str(hub.tmp / f"{name}-schedule")]


def _sweep_overlaps(run: Run) -> None:
    spans = []
    for proc in run.hub.procs.procs:
        if proc.name.startswith("worker"):
            for stamp, took, report in SWEEP_LINE.findall(proc.output()):
                if "'ran': True" in report:
                    end = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    spans.append((end - float(took), end, report))
    spans.sort()
    overlaps = sum(1 for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1])
    woken = sum(int(re.search(r"'woken': (\d+)", s[2]).group(1)) for s in spans)
    logs = [p.output() for p in run.hub.procs.procs if p.name.startswith("worker")]
    total = sum(log.count("Task b2bhub.sweep[") // 2 for log in logs)
    delivers = sum(log.count("Task b2bhub.deliver[") // 2 for log in logs)
    run.result.notes.append(f"sweep tasks {total}, sweeps that ran {len(spans)}, "
                            f"overlapping {overlaps}, wake-ups by sweeps {woken}, "
                            f"deliver tasks {delivers} for {run.result.accepted} documents "
                            "(2 targets each)")
    if overlaps:
        run.result.duplicated += overlaps
        run.result.notes.append("two sweeps overlapped (counted as duplicated)")


def long_transaction(run: Run) -> None:
    """A transaction holding locks for ``fault`` seconds while intake runs: on
    PostgreSQL ``LOCK TABLE messages IN SHARE MODE`` (no message can be inserted), on
    SQLite ``BEGIN IMMEDIATE`` (no write at all)."""
    hub = run.hub
    hub.start_partner()
    hub.start_web()
    hub.procs.beat()
    hub.worker()
    run.load()
    time.sleep(run.sizes.seconds / 4)
    with run.fault(), hub.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("LOCK TABLE messages IN SHARE MODE"))
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        time.sleep(run.sizes.fault)
        conn.rollback()
    run.result.notes.append(f"locks held {run.sizes.fault:.0f} s")


def disk_full(run: Run) -> None:
    """The payload store on a small tmpfs, filled up while documents come in; space
    given back after ``fault`` seconds."""
    hub, store = run.hub, hub_payload_mount(run)
    hub.start_partner()
    hub.start_web()
    hub.procs.beat()
    hub.worker()
    filler = store / "filler"
    with run.fault():
        _fill(filler)
        run.load()
        time.sleep(run.sizes.fault)
        left = len(hub.left_in_inbox())
        refused = sum(len(d.refusals) for d in run.ledger.docs.values())
        run.result.notes.append(f"store full: {left} files waiting in the inbox, "
                                f"{refused} AS2 posts refused meanwhile")
        filler.unlink()
    run.wait_load()


def hub_payload_mount(run: Run) -> Path:
    return run.hub.payload_dir


def _fill(path: Path) -> None:
    """Write zeros until the file system has no byte left (unbuffered: nothing is held
    back for a close to fail on)."""
    with open(path, "wb", buffering=0) as fh:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    fh.write(b"\0" * chunk)
            except OSError:
                pass


def clock_step(run: Run) -> None:
    """One of two workers' clock 10 minutes ahead, then 10 minutes behind, then right
    (``B2BHUB_FAKE_CLOCK_FILE``), while documents flow."""
    hub = run.hub
    offset = hub.tmp / "clock-offset"
    offset.write_text("0")
    hub.start_web()
    hub.procs.beat()
    hub.worker({"B2BHUB_FAKE_CLOCK_FILE": str(offset)})
    hub.worker()
    run.load()
    with run.fault():
        for step in ("600", "-600"):
            offset.write_text(step)
            time.sleep(run.sizes.fault / 2)
        offset.write_text("0")
    run.result.notes.append(f"+10 min for {run.sizes.fault / 2:.0f} s, "
                            f"then -10 min for {run.sizes.fault / 2:.0f} s")


@dataclass
class Scenario:
    name: str
    run: object
    full: Sizes
    short: Sizes | None = None
    backends: tuple[str, ...] = benchlib.BACKENDS
    tmpfs: bool = False


SCENARIOS = [
    Scenario("worker-kill9", worker_kill9, Sizes(150, 0, 15, 420, 0), Sizes(60, 0, 8, 150, 0)),
    Scenario("web-kill9-as2", web_kill9, Sizes(40, 30, 15, 120, 0), Sizes(20, 15, 10, 90, 0)),
    Scenario("beat-kill9", beat_kill9, Sizes(80, 0, 20, 180, 0)),
    Scenario("sigterm-storm", sigterm_storm, Sizes(150, 0, 25, 180, 25),
             Sizes(60, 0, 15, 120, 15)),
    Scenario("redis-stop", redis_stop, Sizes(100, 20, 40, 180, 60),
             backends=("postgres",)),
    Scenario("pg-restart", pg_restart, Sizes(100, 20, 20, 180, 0),
             backends=("postgres",)),
    Scenario("two-beats", two_beats, Sizes(100, 0, 20, 120, 20)),
    Scenario("long-transaction", long_transaction, Sizes(60, 15, 20, 150, 20)),
    Scenario("disk-full", disk_full, Sizes(40, 10, 8, 150, 15), tmpfs=True),
    Scenario("clock-step", clock_step, Sizes(100, 0, 30, 180, 30)),
]


# --- running ------------------------------------------------------------------------------

class Servers:
    """The private PostgreSQL and Redis of the postgres backend, started on first use."""

    def __init__(self, root: Path, args):
        self.root, self.args = root, args
        self.pg: faultlib.PrivatePostgres | None = None
        self.redis: faultlib.PrivateRedis | None = None

    def backend(self, name: str, scenario: str, data_dir: Path) -> Backend:
        data_dir.mkdir(parents=True, exist_ok=True)
        if name == "embedded":
            return Backend(name, f"sqlite:///{data_dir / 'b2bhub.sqlite'}",
                           f"sqla+sqlite:///{data_dir / 'broker.sqlite'}", str(data_dir))
        if self.pg is None:
            self.pg = faultlib.PrivatePostgres(self.root / "pg", self.args.pg_port)
            self.pg.start()
            self.redis = faultlib.PrivateRedis(self.root / "redis", self.args.redis_port)
            self.redis.start()
        if self.redis.popen is None:
            self.redis.start()
        self.redis.flush()
        url = self.pg.fresh_database("faults_" + scenario.replace("-", "_"))
        return Backend(name, url, self.redis.url, str(data_dir))

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        if self.pg is not None:
            self.pg.stop()


class Tmpfs:
    """A small tmpfs for the payload store (root may mount); else a note why not."""

    def __init__(self, path: Path, size: str = "16m"):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(path)], capture_output=True, text=True)
        self.mounted = done.returncode == 0
        self.why = done.stderr.strip()

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def run_one(scenario: Scenario, backend_name: str, servers: Servers, root: Path,
            args) -> Result:
    sizes = scenario.short if args.short and scenario.short else scenario.full
    tmp = root / f"{scenario.name}-{backend_name}"
    tmp.mkdir(parents=True)
    backend = servers.backend(backend_name, scenario.name, tmp / "data")
    mount = Tmpfs(tmp / "store") if scenario.tmpfs else None
    if mount is not None and not mount.mounted:
        result = Result(scenario.name, backend_name)
        result.stuck = 1
        result.notes.append(f"could not mount a tmpfs ({mount.why}): not run")
        return result
    run = None
    try:
        run = Run(scenario.name, backend, tmp, args, sizes,
                  payload_dir=mount.path if mount else None,
                  servers={"pg": servers.pg, "redis": servers.redis})
        print(f"\n=== {scenario.name} on {backend_name} (seed {run.seed}, "
              f"{sizes.files} files + {sizes.as2} AS2, deadline {sizes.deadline:.0f} s)",
              flush=True)
        try:
            scenario.run(run)
        except Exception as exc:  # what was put in is still checked
            run.result.stuck = max(run.result.stuck, 1)
            run.result.notes.append(f"scenario failed: {type(exc).__name__}: "
                                    f"{str(exc)[:600]}")
        result = run.settle()
        hook = getattr(run, "settle_hook", None)
        if hook:
            hook()
    except Exception as exc:
        result = run.result if run is not None else Result(scenario.name, backend_name)
        result.stuck = max(result.stuck, 1)
        result.notes.append(f"scenario failed: {type(exc).__name__}: {str(exc)[:600]}")
    finally:
        if run is not None:
            if not result.ok or args.keep:
                (tmp / "logs.txt").write_text(run.hub.procs.logs(tail=20000))
            run.close()
        if mount is not None:
            mount.close()
    _print_result(result, tmp)
    return result


def _print_result(r: Result, tmp: Path) -> None:
    print(f"--- {r.scenario} / {r.backend}: accepted {r.accepted}, refused {r.refused}, "
          f"lost {r.lost}, duplicated {r.duplicated}, repeats (allowed) {r.repeats}, "
          f"stuck {r.stuck}, recovery {_secs(r.recovery)}, longest gap {_secs(r.gap)}"
          f"{'' if r.ok else '  FAILED (logs in ' + str(tmp) + ')'}")
    for note in r.notes[:12]:
        print(f"    {note}")
    sys.stdout.flush()


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", nargs="+", choices=benchlib.BACKENDS,
                        default=list(benchlib.BACKENDS))
    parser.add_argument("--scenario", nargs="+", choices=[s.name for s in SCENARIOS])
    parser.add_argument("--short", action="store_true",
                        help="the CI form: worker-kill9, web-kill9-as2, sigterm-storm, "
                             "smaller, lease_seconds 60 unless --lease says otherwise")
    parser.add_argument("--lease", type=int, default=None,
                        help="the lease_seconds setting (default: the hub's 300; 60 with "
                             "--short)")
    parser.add_argument("--seed", type=int, default=None)
    # Both below Linux's ephemeral range (32768-60999 by default): an outgoing connection
    # of any process here takes its local port from that range, and one that held 55432
    # (the old default) while the cluster started made PostgreSQL's bind fail in CI.
    parser.add_argument("--pg-port", type=int, default=25432)
    parser.add_argument("--redis-port", type=int, default=6391)
    parser.add_argument("--keep", action="store_true", help="keep the logs of every run")
    args = parser.parse_args()
    if args.lease is None:
        from b2bhub.engine.settings import DeliverySettings
        args.lease = 60 if args.short else DeliverySettings().lease_seconds
    chosen = [s for s in SCENARIOS if (s.name in args.scenario if args.scenario else
                                       (not args.short or s.short is not None))]
    root = faultlib.temp_root("b2bhub-faults-")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=faultlib.ROOT,
                            capture_output=True, text=True).stdout.strip()
    started = time.monotonic()
    print(f"fault suite at commit {commit}, lease_seconds {args.lease}, "
          f"{'short' if args.short else 'full'} form, work in {root}")
    for name, value in benchlib.environment(["embedded"]):
        print(f"  {name}: {value}")
    servers = Servers(root, args)
    results = []
    try:
        for backend in args.backend:
            for scenario in chosen:
                if backend in scenario.backends:
                    results.append(run_one(scenario, backend, servers, root, args))
    finally:
        servers.stop()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    benchlib.print_table(
        f"fault suite, commit {commit}, lease_seconds {args.lease}, "
        f"{time.monotonic() - started:.0f} s, load average at the end {load}",
        ["scenario", "backend", "accepted", "refused", "lost", "duplicated", "repeats",
         "stuck", "recovery s", "longest gap s"],
        [[r.scenario, r.backend, r.accepted, r.refused, r.lost, r.duplicated, r.repeats,
          r.stuck, _secs(r.recovery).rstrip(" s"), _secs(r.gap).rstrip(" s")]
         for r in results])
    if all(r.ok for r in results):
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        return 0
    print(f"FAILED: {sum(not r.ok for r in results)} scenario(s); logs kept in {root}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
