"""What the file benchmarks share: a fresh backend, a poller -> writer setup, real
worker and beat processes, dropping files atomically, and the machine's description.

Each run gets a database of its own (SQLite in a temporary directory, or a PostgreSQL
database ``b2bhub_fbench_<pid>`` dropped afterwards) and empties Redis database 7 before
it starts. Processes are the ones the tests start (``tests/procs.py``): ``celery -A
b2bhub.runtime.worker worker --pool solo -Q deliveries,default`` and ``celery ... beat``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import machine_speed  # noqa: E402  (bench/, this script's directory)
from sqlalchemy import create_engine, text  # noqa: E402

from tests.procs import Processes  # noqa: E402

PG_ADMIN_URL = os.environ.get("B2BHUB_BENCH_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("B2BHUB_BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
ORGANIZATION, PARTNER = "mycompany", "acme"
POLLER, WRITER = "poller", "writer"


@dataclass
class Bench:
    """One run's backend, directories and processes."""

    backend: str
    urls: dict[str, str]
    tmp: Path
    inbox: Path    # the poller's base_directory
    outbox: Path   # the writer's base_directory
    staging: Path  # where files are written before they are renamed into the inbox
    procs: Processes | None = None

    def drop_dir(self) -> Path:
        """The directory the path pattern ``{to}/{filename}`` reads the partner from."""
        return self.inbox / PARTNER


def arguments(description: str, extra: Callable[[argparse.ArgumentParser], None]
              ) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--backend", choices=("embedded", "postgres"), default="embedded")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (logs) afterwards")
    extra(parser)
    return parser.parse_args()


@contextmanager
def fresh_bench(backend: str, keep: bool = False, writer_concurrency: int = 4,
                take_by_link: bool = False, target: dict | None = None,
                scan_shards: int = 1) -> Iterator[Bench]:
    """A migrated backend with mycompany, acme, poller -> writer (its Max Concurrent
    Deliveries ``writer_concurrency``) and a route; the poller's ``take_by_link`` and
    ``scan_shards``.
    ``target``: another instance in the writer's place (the API's shape, its name
    ``writer``), e.g. an http_poster."""
    tmp = Path(tempfile.mkdtemp(prefix="b2bhub-fbench-"))
    bench = Bench(backend, {}, tmp, tmp / "in", tmp / "out", tmp / "staging")
    bench.staging.mkdir()
    drop_db = None
    try:
        bench.urls, drop_db = _create_backend(backend, tmp)
        _migrate_and_configure(bench, writer_concurrency, take_by_link, target, scan_shards)
        yield bench
    finally:
        if bench.procs is not None:
            bench.procs.stop_all()
        if drop_db is not None:
            drop_db()
        if keep:
            print(f"kept {tmp}")
        else:
            subprocess.run(["rm", "-rf", str(tmp)], check=False)


def _create_backend(backend: str, tmp: Path) -> tuple[dict[str, str], Callable | None]:
    data_dir = tmp / "data"
    data_dir.mkdir()
    if backend == "embedded":
        return {"database_url": f"sqlite:///{data_dir / 'b2bhub.sqlite'}",
                "broker_url": f"sqla+sqlite:///{data_dir / 'broker.sqlite'}",
                "data_dir": str(data_dir)}, None
    import redis
    redis.Redis.from_url(REDIS_URL).flushdb()
    name = f"b2bhub_fbench_{os.getpid()}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    return {"database_url": url, "broker_url": REDIS_URL, "data_dir": str(data_dir)}, drop


def _migrate_and_configure(bench: Bench, writer_concurrency: int,
                           take_by_link: bool = False, target: dict | None = None,
                           scan_shards: int = 1) -> None:
    from flask_migrate import upgrade

    from b2bhub import create_app
    from b2bhub.config.extensions import db
    from b2bhub.runtime import hub
    from b2bhub.services import config as svc

    app = create_app({"DATA_DIR": bench.urls["data_dir"],
                      "SQLALCHEMY_DATABASE_URI": bench.urls["database_url"],
                      "BROKER_URL": bench.urls["broker_url"],
                      "PAYLOAD_DIR": str(Path(bench.urls["data_dir"]) / "payloads")})
    with app.app_context():
        upgrade(revision="heads")  # the core and each plugin branch
        registry = hub.registry()
        session = db.session
        svc.create_party(session, "organization", ORGANIZATION)
        svc.create_party(session, "partner", PARTNER)
        svc.save_instance(session, registry, {
            "name": POLLER, "type": "file_poller",
            "config": {"base_directory": str(bench.inbox), "path_pattern": "{to}/{filename}",
                       "polling_interval": 1, "take_by_link": take_by_link,
                       "scan_shards": scan_shards}})
        svc.save_instance(session, registry, {
            "max_concurrent_deliveries": writer_concurrency, **(target or {
                "type": "file_writer",
                "config": {"base_directory": str(bench.outbox),
                           "filename_pattern": "{original_filename}"}}), "name": WRITER})
        svc.create_route(session, registry, POLLER, "*", PARTNER, WRITER)
        session.commit()
        db.engine.dispose()


def start_processes(bench: Bench, workers: int,
                    extra_env: dict[str, str] | None = None) -> Processes:
    """``workers`` worker processes and beat, each ready before this returns; each with
    ``extra_env`` (another payload store, say)."""
    bench.procs = Processes(bench.urls, bench.tmp)
    for _ in range(workers):
        bench.procs.worker(extra_env)
    bench.procs.beat(extra_env)
    bench.drop_dir().mkdir(parents=True, exist_ok=True)
    return bench.procs


def drop_file(bench: Bench, name: str, chunks: Iterator[bytes]) -> None:
    """Write a file outside the scanned tree, then rename it in: never seen half-written."""
    staged = bench.staging / name
    with open(staged, "wb") as out:
        for chunk in chunks:
            out.write(chunk)
    os.rename(staged, bench.drop_dir() / name)


def written_files(outbox: Path) -> int:
    """Files the writer has put in place (its hidden temporary files not counted)."""
    try:
        with os.scandir(outbox) as listing:
            return sum(1 for e in listing if not e.name.startswith(".b2bhub-"))
    except FileNotFoundError:
        return 0


def delivered_count(database_url: str) -> int:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return conn.scalar(text(
                "SELECT count(*) FROM deliveries WHERE state = 'delivered'"))
    finally:
        engine.dispose()


def status_counts(database_url: str) -> dict[str, int]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(text(
                "SELECT status, count(*) FROM messages GROUP BY status")).all())
    finally:
        engine.dispose()


def write_counts(database_url: str) -> dict[str, int]:
    """How often the run wrote: deliveries, attempts made, and history lines that say a
    file was written. One of each per message, or a file was written twice (a second
    message for one dropped file, or a second attempt of one delivery)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            deliveries, attempts, messages = conn.execute(text(
                "SELECT count(*), coalesce(sum(attempt), 0), count(DISTINCT message_id) "
                "FROM deliveries")).one()
            writes = conn.scalar(text(
                "SELECT count(*) FROM history WHERE type = 'delivery_changed' "
                "AND text LIKE '% delivered: wrote %'"))
    finally:
        engine.dispose()
    return {"deliveries": deliveries, "attempts": int(attempts),
            "messages with a delivery": messages, "writes": writes}


def environment(bench: Bench, workers: int) -> list[str]:
    """What the figures depend on: machine, load, versions, backend."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    backend = ("PostgreSQL + Redis" if bench.backend == "postgres"
               else "embedded (SQLite + kombu SQLAlchemy broker)")
    return [f"time: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            f"backend: {backend}", f"workers: {workers} (celery --pool solo) + beat",
            f"machine: {os.cpu_count()} cores, {platform.platform()}",
            f"python: {platform.python_version()}",
            f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
            f"commit: {commit}{' (with local changes)' if dirty else ''}",
            *(f"{name}: {value}" for name, value in machine_speed(bench.backend == "postgres"))]


class CpuMeter:
    """CPU seconds (user + system, from ``/proc``) that each worker, beat and the
    PostgreSQL backends serving the bench's database spend between :meth:`start` and
    :meth:`stop`: what a message costs, apart from what the machine's other work takes.
    A backend that connects after :meth:`start` counts from zero."""

    def __init__(self, bench: Bench):
        self.bench = bench
        self._start: dict[int, float] = {}

    def _pids(self) -> dict[int, str]:
        pids = {p.pid: p.name for p in self.bench.procs.procs}
        if self.bench.backend == "postgres":
            name = self.bench.urls["database_url"].rsplit("/", 1)[1]
            engine = create_engine(PG_ADMIN_URL)
            try:
                with engine.connect() as conn:
                    pids.update({pid: "postgres" for pid in conn.scalars(text(
                        "SELECT pid FROM pg_stat_activity WHERE datname = :name"
                        " AND pid <> pg_backend_pid()"), {"name": name})})
            finally:
                engine.dispose()
        return pids

    def start(self) -> None:
        self._start = {pid: cpu_seconds(pid) for pid in self._pids()}

    def stop(self) -> dict[str, float]:
        """Seconds per process name (PostgreSQL backends summed as ``postgres``)."""
        spent: Counter[str] = Counter()
        for pid, name in self._pids().items():
            spent[name] += cpu_seconds(pid) - self._start.get(pid, 0.0)
        return dict(spent)


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Profiler:
    """``py-spy record`` of each worker while the run lasts (when py-spy is installed),
    written as raw collapsed stacks; :func:`top_costs` sums them up."""

    def __init__(self, out_dir: Path | None, procs: Processes):
        self.out_dir, self.recorders = out_dir, []
        if out_dir is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        for proc in procs.procs:
            if proc.name.startswith("worker"):
                out = out_dir / f"{proc.name}.txt"
                self.recorders.append((out, subprocess.Popen(
                    [spy, "record", "-f", "raw", "-r", "50", "-o", str(out),
                     "--pid", str(proc.pid)], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)))

    def stop(self) -> list[str]:
        """Stop recording; the top costs of each worker."""
        report = []
        for out, recorder in self.recorders:
            recorder.send_signal(signal.SIGINT)
            recorder.wait(30)
            report += [f"profile {out}:"] + top_costs(out)
        return report


def top_costs(raw: Path, limit: int = 25) -> list[str]:
    """The hub's own functions (b2bhub, plugins) by share of samples, inclusive."""
    if not raw.exists():
        return ["  (no samples)"]
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        names = {_frame(f) for f in stack.split(";")}
        for name in names:
            if name.split(" ")[-1].startswith(("(b2bhub/", "(plugins/")):
                inclusive[name] += int(count)
    return [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(limit)]


def _frame(frame: str) -> str:
    """``func (/path/to/b2bhub/engine/x.py:12)`` -> ``func (b2bhub/engine/x.py)``."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for root in ("/b2bhub/", "/plugins/"):
        if root in path:
            path = root[1:] + path.split(root, 1)[1]
    return f"{name} ({path})"


def wait_until(check: Callable[[], bool], timeout: float, what: str,
               every: float = 0.05, on_wait: Callable[[], None] | None = None) -> float:
    """Poll ``check`` until true; the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        if on_wait is not None:
            on_wait()
        time.sleep(every)
    raise TimeoutError(f"not {what} within {timeout:.0f} s")
