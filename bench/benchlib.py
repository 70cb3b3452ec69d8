"""What both benchmarks share: a fresh database with the migrated schema, bulk loading,
the environment they ran in, and a plain table printer.

A run never touches an existing database: the embedded backend gets a SQLite file in a
temporary directory, PostgreSQL a database ``b2bhub_bench_<pid>`` that is dropped at the
end (also after Ctrl-C). The schema comes from the migrations, as in production.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIST = ROOT / "tests" / "plugin_dist"
for _path in (str(ROOT), str(PLUGIN_DIST)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from sqlalchemy import DateTime, bindparam, create_engine, text  # noqa: E402
from sqlalchemy.engine import Connection, Engine, make_url  # noqa: E402

PG_ADMIN_URL = os.environ.get("B2BHUB_BENCH_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("B2BHUB_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
BACKENDS = ("embedded", "postgres")
TARGET = "noop"


@dataclass
class Backend:
    """The URLs of one fresh benchmark database and its broker."""

    name: str
    database_url: str
    broker_url: str
    data_dir: str

    @property
    def postgres(self) -> bool:
        return self.name == "postgres"

    def engine(self) -> Engine:
        """A plain SQLAlchemy engine with the app's SQLite pragmas."""
        from b2bhub.config import database
        database.install()
        args = {"connect_args": {"timeout": 30}} if not self.postgres else {}
        return create_engine(self.database_url, **args)

    def env(self) -> dict[str, str]:
        """The environment a worker process of this backend runs with."""
        path = os.pathsep.join([str(PLUGIN_DIST), str(ROOT), os.environ.get("PYTHONPATH", "")])
        return {**os.environ, "B2BHUB_DATABASE_URL": self.database_url,
                "B2BHUB_BROKER_URL": self.broker_url, "B2BHUB_DATA_DIR": self.data_dir,
                "B2BHUB_PAYLOAD_DIR": str(Path(self.data_dir) / "payloads"),
                "B2BHUB_SECRET_KEY": "bench", "B2BHUB_LOG_LEVEL": "warning",
                "PYTHONPATH": path.rstrip(os.pathsep)}


@contextmanager
def fresh_backend(name: str) -> Iterator[Backend]:
    """A new, migrated database (and an empty broker), removed afterwards."""
    data_dir = tempfile.mkdtemp(prefix=f"b2bhub-bench-{name}-")
    db_name = f"b2bhub_bench_{os.getpid()}"
    admin = None
    try:
        if name == "postgres":
            admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{db_name}"'))
            url = make_url(PG_ADMIN_URL).set(database=db_name)
            backend = Backend(name, url.render_as_string(hide_password=False), REDIS_URL,
                              data_dir)
            _flush_redis(REDIS_URL)
        else:
            backend = Backend(name, f"sqlite:///{data_dir}/b2bhub.sqlite",
                              f"sqla+sqlite:///{data_dir}/broker.sqlite", data_dir)
        migrate(backend)
        yield backend
    finally:
        if admin is not None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
            admin.dispose()
        shutil.rmtree(data_dir, ignore_errors=True)


def _flush_redis(url: str) -> None:
    """Empty the benchmark's own Redis database, so no old wake-up wakes a worker."""
    import redis
    client = redis.Redis.from_url(url, socket_connect_timeout=3)
    client.flushdb()
    client.close()


def make_app(backend: Backend):
    """The Flask app on this backend; wake-ups after commit are dropped (the benchmarks
    publish the ones they want themselves)."""
    import b2bhub_testplugins as testplugins

    from b2bhub import create_app
    from b2bhub.plugin.registry import PluginRegistry
    registry = PluginRegistry()
    registry.register(testplugins.Noop)
    return create_app({"DATA_DIR": backend.data_dir,
                       "SQLALCHEMY_DATABASE_URI": backend.database_url,
                       "BROKER_URL": backend.broker_url, "SECRET_KEY": "bench",
                       "PAYLOAD_DIR": str(Path(backend.data_dir) / "payloads"),
                       "LOG_LEVEL": "WARNING", "PLUGIN_REGISTRY": registry,
                       "WAKEUP_PUBLISHER": lambda items: None})


def migrate(backend: Backend) -> None:
    """Apply the Alembic migrations, exactly as ``b2bhub run`` does."""
    from flask_migrate import upgrade
    app = make_app(backend)
    with app.app_context():
        upgrade(revision="heads")  # the core and each plugin branch
        app.extensions["sqlalchemy"].engines[None].dispose()


def create_target(backend: Backend, max_concurrent: int) -> None:
    """The no-op target, its parties, a source and a route, through the services."""
    from b2bhub.config.extensions import db
    from b2bhub.services import config as svc
    app = make_app(backend)
    with app.app_context():
        registry = app.extensions["b2bhub.plugin.registry"]
        svc.create_party(db.session, "organization", "mycompany")
        svc.create_party(db.session, "partner", "acme")
        svc.save_instance(db.session, registry, {
            "name": TARGET, "type": "noop", "max_concurrent_deliveries": max_concurrent})
        db.session.commit()
        app.extensions["sqlalchemy"].engines[None].dispose()


# --- bulk loading ---------------------------------------------------------------------

def _numbers(conn: Connection) -> str:
    """A row source of i = 1..:n: generate_series on PostgreSQL, a recursive CTE on
    SQLite. Used as ``WITH {numbers} INSERT ... SELECT ... FROM s``."""
    if conn.dialect.name == "postgresql":
        return "s AS (SELECT i FROM generate_series(1, :n) AS g(i))"
    return "RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)"


def bulk_messages(conn: Connection, n: int, now: datetime, status: str,
                  payloads: bool = True) -> int:
    """Insert ``n`` messages (with one payload row each); returns the first new id."""
    first = (conn.execute(text("SELECT max(id) FROM messages")).scalar() or 0) + 1
    if n <= 0:
        return first
    sql = f"""WITH {_numbers(conn)}
        INSERT INTO messages (id, source, from_party, to_party, direction,
                              original_filename, sequence_key, size, sha256, status,
                              status_text, created_at, updated_at)
        SELECT :first + i - 1, 'inbox', 'acme', 'mycompany', 'inbound', 'order.edi',
               'acme>mycompany', 11, :digest, :status, '', :now, :now FROM s"""
    digest = "0" * 64
    conn.execute(_timed(sql), {"n": n, "first": first, "now": now, "status": status,
                               "digest": digest})
    if conn.dialect.name == "postgresql":  # explicit ids: move the sequence past them
        conn.execute(text("SELECT setval(pg_get_serial_sequence('messages', 'id'), "
                          "(SELECT max(id) FROM messages))"))
    if not payloads:
        return first
    conn.execute(_timed("""INSERT INTO payloads (message_id, stage, digest, size, created_at)
        SELECT id, 'unpacked', :digest, 11, :now FROM messages WHERE id >= :first"""),
                 {"first": first, "now": now, "digest": digest})
    return first


def bulk_deliveries(conn: Connection, first_message: int, state: str, now: datetime,
                    due_at: datetime | None, next_wake_at: datetime | None,
                    settled_at: datetime | None = None, attempt: int = 0) -> None:
    """One delivery to the no-op target for every message from ``first_message`` on."""
    conn.execute(_timed("""INSERT INTO deliveries (message_id, target, state, attempt,
            failures, due_at, next_wake_at, wake_count, sequence_key,
            last_result, created_at, updated_at, settled_at)
        SELECT id, :target, :state, :attempt, 0, :due, :wake, 1, 'acme>mycompany',
               '', :now, :now, :settled FROM messages WHERE id >= :first"""),
                 {"target": TARGET, "state": state, "attempt": attempt, "due": due_at,
                  "wake": next_wake_at, "now": now, "settled": settled_at,
                  "first": first_message})


def _timed(sql: str):
    """``text()`` with every time parameter bound as a DateTime, so SQLite stores it in
    the same text form as the ORM (string comparisons of times stay correct)."""
    names = ("now", "due", "wake", "settled", "past", "until", "queued_due")
    clause = text(sql)
    present = [name for name in names if f":{name}" in sql]
    return clause.bindparams(*(bindparam(name, type_=DateTime) for name in present))


def analyze(engine: Engine) -> None:
    """Fresh planner statistics; on PostgreSQL also VACUUM, so that autovacuum does not
    start on the freshly loaded rows while the benchmark times something else."""
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
        return
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))


def scalar(backend: Backend, sql: str):
    """The one value of a query, on a connection of its own."""
    engine = backend.engine()
    with engine.connect() as conn:
        value = conn.execute(text(sql)).scalar()
    engine.dispose()
    return value


def as_time(value):
    """A time read through an aggregate (``min``, ``max``): SQLite returns its stored
    text there, not a datetime; None stays None."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value


# --- reporting ------------------------------------------------------------------------

def environment(backend_names: list[str]) -> list[tuple[str, str]]:
    """What the figures depend on: machine, load, versions."""
    import celery
    import sqlalchemy
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = [("run at (UTC)", datetime.utcnow().strftime("%Y-%m-%d %H:%M:%S")),
            ("cpu count", str(os.cpu_count())),
            ("load average (1, 5, 15 min)", load),
            ("platform", platform.platform()),
            ("python", platform.python_version()),
            ("sqlalchemy / celery", f"{sqlalchemy.__version__} / {celery.__version__}"),
            ("backends", ", ".join(backend_names))]
    if "embedded" in backend_names:
        rows.append(("sqlite", sqlite3.sqlite_version))
    if "postgres" in backend_names:
        rows.append(("postgresql", _pg_version()))
    return rows + machine_speed(postgres="postgres" in backend_names)


def machine_speed(postgres: bool = True) -> list[tuple[str, str]]:
    """Two figures of the hour the run took, printed with every bench's environment: the
    same machine ran the same floor at half its speed on a slow hour (bench/RESULTS.md,
    2026-12-07), and these tell such an hour from a change of the code. A fixed piece of
    Python (20,000 JSON round trips of a history line's data, the median of 5 runs), and
    the round trip to PostgreSQL on loopback (a prepared ``SELECT 1`` through psycopg,
    the median of 1,000), which every statement of the hub waits for once."""
    import json
    import statistics

    line = {"state": "delivered", "attempt": 1, "result": "wrote 2,048 bytes",
            "target": "noop", "ids": list(range(8))}
    runs = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(20_000):
            json.loads(json.dumps(line))
        runs.append(time.perf_counter() - began)
    rows = [("cpu reference (ms; 20,000 JSON round trips)",
             f"{1000 * statistics.median(runs):.1f}")]
    if postgres:
        rows.append(("postgresql round trip (us; SELECT 1)", _pg_round_trip()))
    return rows


def _pg_round_trip() -> str:
    import statistics

    import psycopg
    url = make_url(PG_ADMIN_URL).set(drivername="postgresql").render_as_string(
        hide_password=False)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            times = []
            for _ in range(1_000):
                began = time.perf_counter()
                conn.execute("SELECT 1", prepare=True).fetchall()
                times.append(time.perf_counter() - began)
    except Exception as exc:  # the figures still print without it
        return f"unknown ({type(exc).__name__})"
    return f"{1e6 * statistics.median(times):.0f}"


def _pg_version() -> str:
    engine = create_engine(PG_ADMIN_URL)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SHOW server_version")).scalar()
    except Exception as exc:  # the figures still print without it
        return f"unknown ({type(exc).__name__})"
    finally:
        engine.dispose()


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    """A plain fixed-width table, right-aligned numbers."""
    cells = [[str(c) for c in header]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    line = "  ".join("-" * w for w in widths)
    print(line)
    for index, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if index == 0:
            print(line)
    print(line, flush=True)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def run_together(target, arglists: list[tuple], clock=None):
    """Start one process (spawned) per argument tuple, let them all begin at once, wait
    for every one; ``target(*args, ready, go)`` releases ``ready`` when set up, then waits
    for ``go``. Returns ``clock()`` (default ``time.monotonic``) read just before ``go``,
    the moment the work starts. Raises when one fails to start or exits with an error."""
    import multiprocessing
    import time
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [ctx.Process(target=target, args=(*args, ready, go)) for args in arglists]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=60):
            raise RuntimeError("a bench process did not start")
    started = (clock or time.monotonic)()
    go.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a bench process exited with {p.exitcode}")
    return started


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(proc, url: str, what: str, timeout: float = 60.0):
    """``proc`` once ``url`` answers at all (any status); killed, and the bench ended
    naming ``what``, when it does not within ``timeout`` seconds."""
    import requests
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=2)
            return proc
        except requests.RequestException:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{what} did not start")


def start_py_spy(path: str | None, workers: list[int]) -> list[subprocess.Popen]:
    """``py-spy record --gil`` of each of ``workers`` into ``path`` (the first) and
    ``path.1``, ``path.2``, ... (raw, collapsed stacks): where each holds the GIL (the
    samples of a thread waiting on I/O or on the GIL are left out). With
    ``B2BHUB_BENCH_PY_SPY_IDLE=1`` every thread's every sample instead (``--idle``):
    where the wall-clock time went, waits included (keep the stacks of the request
    threads: ``grep 'ThreadWorker.handle '``)."""
    if not path:
        return []
    here = Path(sys.executable).parent / "py-spy"  # installed beside this Python, or on PATH
    spies = []
    which = "--idle" if os.environ.get("B2BHUB_BENCH_PY_SPY_IDLE") else "--gil"
    for index, pid in enumerate(workers):
        command = [str(here) if here.exists() else "py-spy", "record", "--pid", str(pid),
                   which, "--rate", "500", "--format", "raw", "--nonblocking",
                   "--output", path if not index else f"{path}.{index}"]
        spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # attached before the first post
    return spies


def stop_py_spy(spies: list[subprocess.Popen]) -> None:
    for spy in spies:
        spy.send_signal(signal.SIGINT)  # it writes the file on SIGINT
    for spy in spies:
        spy.wait(60)


def process_cpu(pid: int, reaped: bool = False) -> float:
    """User + system CPU seconds of a process so far; with ``reaped``, also those of its
    children that ended (a postmaster's: the backends of connections closed meanwhile)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = fields[11:15] if reaped else fields[11:13]
    return sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")


def by_kind() -> dict[str, float]:
    """CPU seconds so far of this machine's PostgreSQL and Redis server processes, and
    of this process (the clients): with the web workers', where a request's CPU goes on
    a machine whose two cores they all share."""
    seconds = {"postgres": 0.0, "redis": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            kind = ("postgres" if comm == "postgres" else
                    "redis" if comm.startswith("redis-server") else None)
            if kind is not None:
                seconds[kind] += process_cpu(int(entry.name), reaped=True)
        except (OSError, ValueError):
            continue  # ended meanwhile
    own = os.times()
    seconds["clients"] = own.user + own.system
    return seconds


def wait_booted(pids: list[int], quiet: float = 0.5, timeout: float = 60.0) -> None:
    """Once every one of ``pids`` has spent no CPU for ``quiet`` seconds: started (its
    imports, its app made), not in the middle of it. A server answers as soon as one of
    its workers is up; a measurement begun then had the others still starting on the
    same cores and serving nothing."""
    deadline = time.monotonic() + timeout
    last = {pid: process_cpu(pid) for pid in pids}
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = {pid: process_cpu(pid) for pid in pids}
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def worker_pids(master: int, expected: int = 1) -> list[int]:
    """The gunicorn master's worker processes, once ``expected`` of them run."""
    deadline = time.monotonic() + 60
    while True:
        out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split()]
        if len(pids) >= expected or time.monotonic() > deadline:
            return pids
