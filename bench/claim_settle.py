"""Claim + settle throughput of the engine beside the bare floor, measured in one run.

    python bench/claim_settle.py --backend postgres --workers 2 4
    python bench/claim_settle.py --backend embedded --workers 2 4

For every worker count K, on a fresh database with the migrated schema, ``--rounds``
times (default 3), back to back:

* floor: K processes (multiprocessing) loop over the engine's own two statements,
  without Celery, the ORM or any bookkeeping: the claim statement of
  ``b2bhub/engine/machine/claiming.py``, bare (PostgreSQL ``WITH c AS (SELECT ... FOR UPDATE SKIP
  LOCKED LIMIT 16) UPDATE ... RETURNING``, SQLite ``UPDATE ... WHERE id IN (SELECT ...
  LIMIT 16) RETURNING``), and the engine's delivered UPDATE of a whole batch (each row
  fenced by its own attempt number). Like the engine, it settles a batch and claims the
  next in one transaction: one commit per batch. What the floor leaves out is exactly the
  engine's bookkeeping (history lines, message status, live-lease count, target lock,
  wake-ups, lease renewal) and its process machinery (Celery, the plugin call).
* engine: K real worker processes (``celery -A b2bhub.runtime.worker worker --pool solo``), one
  ``b2bhub.deliver`` wake-up per worker published through the real broker (Redis, or
  kombu's SQLAlchemy transport on SQLite); timed from its first claim (the time of the
  first "attempt 1 started" line) until the last delivery was settled. The wake-up's
  way from the publish to that first claim ("pickup") is printed beside it and not
  counted: it is the broker's latency, not claim and settle, and the embedded broker
  polls its table every 0.2 s, so it took 0-0.2 s of a run of 1 s there (timed from the
  publish, the ratio moved by up to 10 points between rounds of the same code).

Both start from the same N queued deliveries to the ``noop`` target of
``tests/plugin_dist`` (claim_batch 16), and both end when all N are ``delivered``.
Elapsed time runs from the start signal to the last ``settled_at`` written. Each round
prints engine/floor; the summary is the median of the rounds' ratios.

``--books`` adds a third run to each round between the two: the floor's loop writing
also what the SPEC asks of every transition (SPEC 11), in the engine's own statements
and in the same transaction: each delivery's transition line, its message's new status
and that change's line, at the claim (In progress) and at the settlement (Delivered).
It tells the share of the gap that is the required bookkeeping itself from what the
engine adds around it (the message locks and state reads that keep a status exact when
two deliveries of one message change at once, Max Concurrent Deliveries, the target
lock, wake-ups, lease renewal, Celery).

``--cpu N``, ``--statements N`` and ``--profile N`` run in this process instead (see
bench/README.md); ``--row-writes`` times a writer of the target's row while the workers
drain.
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import io
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import benchlib
from benchlib import TARGET, Backend
from sqlalchemy import text
from sqlalchemy.engine import Engine

from tests.enginekit import counted_statements

BATCH = 16  # the noop target's claim_batch
DEFAULT_COUNTS = {"postgres": 10_000, "embedded": 10_000}
STUCK_SECONDS = 60.0


@dataclass
class Result:
    backend: str
    workers: int
    deliveries: int
    round: int
    floor_rate: float
    engine_rate: float
    floor_seconds: float
    engine_seconds: float
    load: float  # 1-minute load average when the round ended
    books_rate: float | None = None  # the floor with the status and history (--books)
    pickup: float = 0.0  # seconds from the publish to the engine's first claim

    @property
    def ratio(self) -> float:
        return self.engine_rate / self.floor_rate


def utcnow() -> datetime:
    from b2bhub.models import utcnow as now
    return now()


# --- the load -------------------------------------------------------------------------

def reset(backend: Backend, n: int) -> None:
    """Empty the message tables, then load ``n`` queued deliveries, due now."""
    engine = backend.engine()
    tables = ["history", "alerts", "deliveries", "payloads", "messages"]
    now = utcnow()
    with engine.begin() as conn:
        if backend.postgres:
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                conn.execute(text(f"DELETE FROM {table}"))
        first = benchlib.bulk_messages(conn, n, now, "received")
        benchlib.bulk_deliveries(conn, first, "queued", now, due_at=now - timedelta(seconds=1),
                                 next_wake_at=now + timedelta(hours=1))
    benchlib.analyze(engine)
    engine.dispose()


def delivered(engine) -> tuple[int, datetime | None]:
    """How many deliveries are delivered, and when the last one was settled."""
    with engine.connect() as conn:
        row = conn.execute(text("SELECT count(*), max(settled_at) FROM deliveries "
                                "WHERE state = 'delivered'")).one()
    return row[0], benchlib.as_time(row[1])


# --- the floor ------------------------------------------------------------------------

def _claim_sql(postgres: bool) -> str:
    """The claim statement of the engine itself (not a copy that could drift), bare:
    ``LIMIT :n`` without the engine's live-lease count (nor the lane it counts in), no
    column saying whether the claimed row was stalled (which the engine returns to
    resolve that alert), and on PostgreSQL without the join to the messages (what the
    engine's attempts read)."""
    from b2bhub.engine.machine import claiming
    return (claiming._PG_CLAIM if postgres else claiming._SQLITE_CLAIM).format(
        limit=":n", ordered="", stalled="", lane="")


def _claim_driver(postgres: bool):
    """The floor's claim, run by the driver as the engine runs its own."""
    from b2bhub.engine.driver import DriverSQL
    return DriverSQL(_claim_sql(postgres), ("now", "until", "queued_due"))


def floor_process(backend: Backend, owner: str, books: bool, ready, go) -> None:
    """Claim 16; settle them and claim the next 16 in one transaction; until none due.
    ``books``: with the status and history lines of each (:func:`_book`)."""
    engine = backend.engine()
    claim_sql = _claim_driver(backend.postgres)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1")).all()
        conn.rollback()
        ready.release()
        go.wait()
        floor_loop(conn, claim_sql, owner, books)
    engine.dispose()


def _settle_batch(conn, rows, owner: str) -> int:
    """The engine's delivered UPDATE of a batch (``settlement.delivered_driver``, each row
    fenced by its attempt), run as the engine runs it; how many it wrote."""
    from b2bhub.engine.machine import settlement
    statement, params = settlement.delivered_driver(
        [(delivery_id, attempt, "ok") for delivery_id, _message_id, attempt, _f in rows],
        owner, utcnow(), conn.dialect.name == "postgresql")
    return len(statement.run(conn, params).all())


def floor_loop(conn, claim_sql, owner: str, books: bool = False) -> int:
    """The floor's loop on one connection; returns how many it settled. ``books``: each
    claim and settlement also writes its statuses and history lines (:func:`_book`)."""
    from b2bhub.engine.machine import claiming
    settled, rows = 0, []
    while True:
        if rows:
            written = _settle_batch(conn, rows, owner)
            if written != len(rows):
                raise RuntimeError(f"{len(rows) - written} fenced settlements not written")
            settled += written
            if books:
                _book(conn, rows, owner, "delivered", "in_progress", "delivered")
        now = utcnow()
        rows = claim_sql.run(conn, {
            "target": TARGET, "now": now, "owner": owner, "n": BATCH,
            "until": now + timedelta(seconds=300),
            "queued_due": now + claiming.QUEUED_SKEW}).all()
        if books and rows:
            _book(conn, rows, owner, "in_progress", "received", "in_progress")
        conn.commit()  # the batch settled and the next one claimed: one commit
        if not rows:
            return settled


def _book(conn, rows, owner: str, state: str, old: str, new: str) -> None:
    """What the SPEC asks of every transition beyond the floor's two statements, in the
    engine's own statements (``b2bhub.engine.status`` and ``history``), set-based for
    the batch: each delivery's transition line, its message's new status and that
    status change's line (SPEC 11: both in the transaction of the change). A message
    here has one delivery, so its status follows from it without reading the states;
    the engine reads them, and locks the messages first on PostgreSQL, because another
    delivery of the same message may change at once."""
    from b2bhub.domain.states import LABELS
    from b2bhub.engine import history, status
    from b2bhub.engine.driver import int_array, run_raw, word_array
    now = utcnow()
    lines = []
    for delivery_id, message_id, attempt, _stalled in rows:
        lines.append({"message_id": message_id, "delivery_id": delivery_id,
                      "type": "delivery_changed", "actor": owner,
                      "text": f"{TARGET}: {state}", "data": {"state": state,
                                                            "attempt": attempt}})
        lines.append({"message_id": message_id, "type": "status_changed", "actor": owner,
                      "text": f"{LABELS[old]} → {LABELS[new]}",
                      "data": {"from": old, "to": new}})
    ids = [message_id for _d, message_id, _a, _s in rows]
    if conn.dialect.name == "postgresql":
        history._pg_lines_after(status._WRITE_PG).run(conn, {
            "status_ids": int_array(ids), "statuses": word_array([new] * len(ids)),
            "rows": json.dumps([history.packed_line(line) for line in lines]),
            "now": now})
        return
    status._WRITE_SQLITE.run(conn, {"pairs": json.dumps([[i, new] for i in ids]),
                                    "now": now})
    created = history._created_at(conn.dialect)(now)
    run_raw(conn, history._SQLITE_LINES, [
        (line["message_id"], line.get("delivery_id"), line["type"], line["actor"],
         line["text"], history.data_json(line["data"]), created) for line in lines],
        many=True)


def run_floor(backend: Backend, workers: int, n: int, books: bool = False) -> float:
    """Seconds the bare loop in ``workers`` processes takes for ``n`` deliveries
    (``books``: with the statuses and history lines)."""
    reset(backend, n)
    start = benchlib.run_together(
        floor_process, [(backend, f"floor-{i}", books) for i in range(workers)],
        clock=utcnow)
    took = _finish(backend, n, start)
    if books:
        _check_books(backend, n)
    return took


def _check_books(backend: Backend, n: int) -> None:
    """Every message Delivered, with four lines each: its delivery's two transitions
    and its two status changes."""
    engine = backend.engine()
    with engine.connect() as conn:
        lines = conn.execute(text("SELECT count(*) FROM history")).scalar()
        done = conn.execute(text("SELECT count(*) FROM messages "
                                 "WHERE status = 'delivered'")).scalar()
    engine.dispose()
    if lines != 4 * n or done != n:
        raise RuntimeError(f"{done} of {n} messages delivered, {lines} lines of {4 * n}")


def _finish(backend: Backend, n: int, start: datetime) -> float:
    engine = backend.engine()
    count, last = delivered(engine)
    engine.dispose()
    if count != n or last is None:
        raise RuntimeError(f"{count} of {n} deliveries delivered")
    return (last - start).total_seconds()


# --- the engine -----------------------------------------------------------------------

class Workers:
    """K real Celery worker processes, as ``b2bhub run`` starts them."""

    def __init__(self, backend: Backend, count: int):
        self.backend, self.count = backend, count
        self.procs: list[subprocess.Popen] = []
        self.logs = [Path(backend.data_dir) / f"worker{i}-{count}.log" for i in range(count)]

    def __enter__(self) -> Workers:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        celery = str(Path(sys.executable).parent / "celery")
        for i, log in enumerate(self.logs):
            log.unlink(missing_ok=True)
            cmd = [celery, "-A", "b2bhub.runtime.worker", "worker", "--pool", "solo",
                   "-Q", "deliveries,default", "-n", f"bench{i}-{os.getpid()}@%h",
                   "--loglevel", "INFO"]
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen(cmd, cwd=benchlib.ROOT,
                                                   env=self.backend.env(), stdout=out,
                                                   stderr=subprocess.STDOUT))
        self._wait_ready()

    def _wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if all(log.exists() and " ready." in log.read_text() for log in self.logs):
                return
            time.sleep(0.2)
        raise RuntimeError("workers not ready in time:\n" + self.tail())

    def check_alive(self) -> None:
        dead = [p for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a worker exited with {dead[0].returncode}:\n" + self.tail())

    def tail(self) -> str:
        out = []
        for log in self.logs:
            if log.exists():
                out.append(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def drains(self) -> list[tuple[int, int]]:
        """(wake-ups run, deliveries claimed) of each worker, from its log."""
        out = []
        for log in self.logs:
            reports = [ast.literal_eval(line[line.index("{"):])
                       for line in log.read_text().splitlines()
                       if "b2bhub.deliver" in line and "succeeded in" in line]
            out.append((len(reports), sum(r.get("claimed", 0) for r in reports)))
        return out

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def publish_wakeups(backend: Backend, count: int) -> datetime:
    """One wake-up per worker through the real broker; returns when the first went out."""
    from b2bhub.runtime.tasks import deliver
    from celeryconfig import delivery_queue
    app = benchlib.make_app(backend)
    with app.app_context():
        celery_app = app.extensions["celery"]
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)
            ids = _first_ids(backend, count)
            start = utcnow()
            for delivery_id in ids:
                deliver.apply_async(args=[TARGET, delivery_id], connection=conn,
                                    routing_key=f"delivery.{TARGET}",
                                    queue=delivery_queue("deliveries"), retry=False)
        app.extensions["sqlalchemy"].engines[None].dispose()
    return start


def _first_ids(backend: Backend, count: int) -> list[int]:
    engine = backend.engine()
    with engine.connect() as conn:
        ids = conn.execute(text("SELECT id FROM deliveries ORDER BY id LIMIT :k"),
                           {"k": count}).scalars().all()
    engine.dispose()
    return list(ids)


def run_engine(backend: Backend, workers: int, n: int) -> tuple[float, float]:
    """Seconds ``workers`` real worker processes take to deliver ``n`` deliveries from
    their first claim, and seconds from the publish to that first claim."""
    reset(backend, 0)
    with Workers(backend, workers) as procs:
        reset(backend, n)  # after the workers are ready: none may start early
        start = publish_wakeups(backend, workers)
        _wait_all_delivered(backend, n, procs)
        time.sleep(0.5)  # let the last drain log its report
        drains = procs.drains()
    print(f"[{backend.name}] {workers} processes: per worker (wake-ups run, claimed): "
          f"{drains}", flush=True)
    first = _first_claim(backend)
    return _finish(backend, n, first), (first - start).total_seconds()


def _first_claim(backend: Backend) -> datetime:
    """When the engine's first claim was made: its "attempt 1 started" line's time."""
    return benchlib.as_time(benchlib.scalar(
        backend, "SELECT min(created_at) FROM history "
                 "WHERE type = 'delivery_changed' AND text LIKE '% started'"))


def _wait_all_delivered(backend: Backend, n: int, procs: Workers) -> None:
    engine = backend.engine()
    last_count, last_move = -1, time.monotonic()
    try:
        while True:
            count, _ = delivered(engine)
            if count >= n:
                return
            if count != last_count:
                last_count, last_move = count, time.monotonic()
            elif time.monotonic() - last_move > STUCK_SECONDS:
                raise RuntimeError(f"stuck at {count} of {n} delivered:\n" + procs.tail())
            procs.check_alive()
            time.sleep(0.25)
    finally:
        engine.dispose()


# --- a writer of the target's row ----------------------------------------------------

def row_write_waits(backend: Backend, workers: int, n: int, every: float = 0.05) -> None:
    """While ``workers`` real workers drain ``n`` deliveries, a writer updates the
    target's instance row every ``every`` seconds (as a probe, a stop or a change of
    its configuration would): how long each UPDATE and its commit took. Claimers hold
    the row (FOR SHARE on PostgreSQL, b2bhub/engine/machine/lanes.py), so a writer waits for
    the claims under way."""
    reset(backend, 0)
    waits: list[float] = []
    done = threading.Event()

    def write() -> None:
        engine = backend.engine()
        with engine.connect() as conn:
            while not done.is_set():
                began = time.perf_counter()
                conn.execute(text("UPDATE plugin_instances SET probe_text = :t "
                                  "WHERE name = :name"), {"t": f"{began}", "name": TARGET})
                conn.commit()
                waits.append(time.perf_counter() - began)
                done.wait(every)
        engine.dispose()

    with Workers(backend, workers) as procs:
        reset(backend, n)
        start = publish_wakeups(backend, workers)
        writer = threading.Thread(target=write)
        writer.start()
        try:
            _wait_all_delivered(backend, n, procs)
        finally:
            done.set()
            writer.join()
    took = _finish(backend, n, start)
    waits.sort()
    benchlib.print_table(
        f"{workers} processes draining {n:,} deliveries ({n / took:,.0f}/s): the target "
        f"row written every {1000 * every:.0f} ms, ms per UPDATE and commit",
        ["backend", "writes", "p50", "p90", "max", "load"],
        [[backend.name, len(waits), 1000 * statistics.median(waits),
          1000 * waits[int(0.9 * (len(waits) - 1))], 1000 * waits[-1],
          f"{os.getloadavg()[0]:.1f}"]])


# --- profile --------------------------------------------------------------------------

def profile_drain(backend: Backend, n: int, sort: str = "cumulative") -> None:
    """cProfile of TargetRunner.drain in this process: where a settle's time goes, and
    the statements it sent per claimed batch."""
    reset(backend, n)
    profiler = cProfile.Profile()
    with counted_statements(Engine) as seen:
        settled, took, _cpu = _drain_here(backend, profiler)
    print(f"\nprofile: one process drained {settled} in {took:.2f} s "
          f"({settled / took:,.0f}/s, under cProfile)")
    batches = settled / BATCH
    print(f"statements per batch of {BATCH}: {sum(seen.values()) / batches:.1f} ("
          + ", ".join(f"{k} {v / batches:.1f}" for k, v in seen.most_common()) + ")")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(30)
    print(out.getvalue())


def _drain_here(backend: Backend, profiler=None) -> tuple[int, float, float]:
    """One TargetRunner.drain in this process: (settled, seconds, CPU seconds)."""
    from b2bhub.engine.runner import TargetRunner
    from b2bhub.runtime import hub
    app = benchlib.make_app(backend)
    with app.app_context():
        runner = TargetRunner(hub.new_session, hub.registry(), hub.store(), "here")
        began, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        report = runner.drain(TARGET, budget=600)
        if profiler is not None:
            profiler.disable()
        took, cpu = time.perf_counter() - began, time.process_time() - cpu
        app.extensions["sqlalchemy"].engines[None].dispose()
    return report.settled, took, cpu


def cpu_per_delivery(backend: Backend, n: int, rounds: int, books: bool = False) -> None:
    """CPU of this process per delivery, the floor's loop beside one drain, alternated:
    a figure the machine's load hardly moves (on PostgreSQL the server's CPU is not in
    it). One process each, so no lock is waited for. ``books``: the floor's loop writes
    the statuses and history lines too (:func:`_book`), so the two sides do the same
    work, and what remains between them is where the engine's own cost is: in this
    process (its Python) or in the server (its statements)."""
    engine = backend.engine()
    claim_sql = _claim_driver(backend.postgres)
    rows = []
    for index in range(1, rounds + 1):
        reset(backend, n)
        with engine.connect() as conn:
            server = benchlib.by_kind()["postgres"]
            began, cpu = time.perf_counter(), time.process_time()
            settled = floor_loop(conn, claim_sql, "floor", books)
            floor = (settled, time.perf_counter() - began, time.process_time() - cpu,
                     benchlib.by_kind()["postgres"] - server)
        reset(backend, n)
        server = benchlib.by_kind()["postgres"]
        here = _drain_here(backend)
        time.sleep(0.3)  # the drain's server process ended: its CPU counts once reaped
        here = (*here, benchlib.by_kind()["postgres"] - server)
        rows.append([backend.name, index, *(1e6 * r[2] / r[0] for r in (floor, here)),
                     *(r[0] / r[1] for r in (floor, here))])
        if backend.postgres:
            rows[-1][4:4] = [1e6 * r[3] / r[0] for r in (floor, here)]
    engine.dispose()
    server = ["floor server us", "engine server us"] if backend.postgres else []
    benchlib.print_table(
        f"one process, {n:,} deliveries: CPU per delivery (us) of this process (and of "
        "the PostgreSQL server) and deliveries per second"
        + ("; the floor writes the statuses and lines (--books)" if books else ""),
        ["backend", "round", "floor CPU us", "engine CPU us", *server, "floor/s",
         "engine/s"], rows)


#: what each statement of a drain is, by the start of its text
STATEMENT_KINDS = [
    ("WITH w AS (UPDATE messages", "history lines + message statuses"),
    ("WITH c AS MATERIALIZED", "claim"),
    ("UPDATE deliveries SET state = 'delivered'", "delivered UPDATE"),
    ("UPDATE deliveries SET state=:state", "delivered UPDATE"),  # SQLite's
    ("UPDATE deliveries", "claim"),  # SQLite's
    ("SELECT messages.id", "messages and payloads read"),
    ("INSERT INTO history", "history lines"),
    ("UPDATE messages", "message statuses"),
    ("SELECT * FROM b2bhub_locked_statuses", "message rows locked, states read"),
    ("SELECT m.id, m.status", "statuses and delivery states read"),
    ("SELECT plugin_instances", "target row (and lane)"),
]


def _kind(statement: str) -> str:
    text_ = " ".join(statement.split())
    for start, kind in STATEMENT_KINDS:
        if text_.startswith(start):
            return kind
    return text_[:40]


def statement_times(backend: Backend, n: int, rounds: int) -> None:
    """Time inside the cursor per statement kind (from the cursor events), per delivery,
    of the floor's loop and of one drain in this process: in one process nothing is
    waited for but the database itself, so on PostgreSQL this is the server's work on
    each statement plus one round trip, and on SQLite SQLite's own work."""
    from collections import defaultdict

    from sqlalchemy import event
    spent: dict[str, dict[str, float]] = {"floor": defaultdict(float),
                                           "engine": defaultdict(float)}
    counts: dict[str, dict[str, int]] = {"floor": defaultdict(int),
                                         "engine": defaultdict(int)}
    current: dict = {"who": None, "began": 0.0}

    def before(conn, cursor, statement, params, context, executemany):
        current["began"] = time.perf_counter()

    def after(conn, cursor, statement, params, context, executemany):
        if current["who"] is None:  # loading the deliveries
            return
        kind = _kind(statement)
        spent[current["who"]][kind] += time.perf_counter() - current["began"]
        counts[current["who"]][kind] += 1

    engine = backend.engine()
    claim_sql = _claim_driver(backend.postgres)
    event.listen(Engine, "before_cursor_execute", before)
    event.listen(Engine, "after_cursor_execute", after)
    settled = {"floor": 0, "engine": 0}
    try:
        for _ in range(rounds):
            current["who"] = None
            reset(backend, n)
            current["who"] = "floor"
            with engine.connect() as conn:
                settled["floor"] += floor_loop(conn, claim_sql, "floor")
            current["who"] = None
            reset(backend, n)
            current["who"] = "engine"
            settled["engine"] += _drain_here(backend)[0]
    finally:
        event.remove(Engine, "before_cursor_execute", before)
        event.remove(Engine, "after_cursor_execute", after)
        engine.dispose()
    kinds = sorted(set(spent["floor"]) | set(spent["engine"]),
                   key=lambda k: -(spent["engine"].get(k, 0) + spent["floor"].get(k, 0)))
    rows = [[backend.name, kind,
             *(f"{counts[w][kind] * BATCH / settled[w]:.2f}" if counts[w].get(kind) else ""
               for w in ("floor", "engine")),
             *(f"{1e6 * spent[w][kind] / settled[w]:.1f}" if counts[w].get(kind) else ""
               for w in ("floor", "engine"))]
            for kind in kinds]
    rows.append([backend.name, "all statements", "", "",
                 *(f"{1e6 * sum(spent[w].values()) / settled[w]:.1f}"
                   for w in ("floor", "engine"))])
    benchlib.print_table(
        f"one process, {n:,} deliveries x {rounds}: time inside the cursor per delivery "
        f"(us), by statement; statements per batch of {BATCH}",
        ["backend", "statement", "floor per batch", "engine per batch", "floor us",
         "engine us"], rows)


# --- main -----------------------------------------------------------------------------

def measure(backend_name: str, workers: list[int], n: int, rounds: int,
            books: bool = False) -> list[Result]:
    """For each worker count, ``rounds`` rounds of floor then engine, back to back: a
    ratio compares two runs taken under the same load on the machine. ``books``: the
    floor with statuses and history lines runs between the two."""
    results = []
    with benchlib.fresh_backend(backend_name) as backend:
        benchlib.create_target(backend, max_concurrent=BATCH * max(workers))
        for k in workers:
            for index in range(1, rounds + 1):
                tag = f"[{backend_name}] {k} processes, round {index}/{rounds}"
                print(f"{tag}, {n:,} deliveries: floor ...", flush=True)
                floor = run_floor(backend, k, n)
                print(f"{tag}: floor {n / floor:,.0f}/s; engine ...", flush=True)
                booked = None
                if books:
                    booked = n / run_floor(backend, k, n, books=True)
                    print(f"{tag}: floor with statuses and lines {booked:,.0f}/s, "
                          f"{100 * booked * floor / n:.0f}% of the floor", flush=True)
                engine, pickup = run_engine(backend, k, n)
                result = Result(backend_name, k, n, index, n / floor, n / engine, floor,
                                engine, os.getloadavg()[0], booked, pickup)
                print(f"{tag}: engine {n / engine:,.0f}/s, {100 * result.ratio:.0f}% of the "
                      f"floor (from its first claim, {1000 * pickup:.0f} ms after the "
                      "publish)", flush=True)
                results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", nargs="+", choices=benchlib.BACKENDS,
                        default=["embedded"])
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3,
                        help="floor + engine rounds per worker count (default 3)")
    parser.add_argument("--count", type=int, default=None,
                        help="deliveries per run (default 10,000)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="instead: cProfile one in-process drain of N deliveries")
    parser.add_argument("--cpu", type=int, default=0, metavar="N",
                        help="instead: CPU per delivery of the floor loop and of one "
                             "drain in this process, N deliveries, --rounds times")
    parser.add_argument("--statements", type=int, default=0, metavar="N",
                        help="instead: time inside the cursor per statement kind and "
                             "delivery, the floor loop and one drain in this process, N "
                             "deliveries, --rounds times")
    parser.add_argument("--row-writes", action="store_true",
                        help="instead: the waits of a writer of the target's row while "
                             "the --workers drain (no floor)")
    parser.add_argument("--books", action="store_true",
                        help="each round also runs the floor with the statuses and "
                             "history lines every transition writes (SPEC 11); with "
                             "--cpu, the floor's loop writes them")
    parser.add_argument("--sort", default="cumulative",
                        help="pstats order of --profile (cumulative, tottime, ...)")
    args = parser.parse_args(argv)
    _print_environment(args.backend)
    if args.cpu or args.profile or args.statements:
        for name in args.backend:
            with benchlib.fresh_backend(name) as backend:
                benchlib.create_target(backend, max_concurrent=BATCH)
                if args.cpu:
                    cpu_per_delivery(backend, args.cpu, args.rounds, args.books)
                elif args.statements:
                    statement_times(backend, args.statements, args.rounds)
                else:
                    profile_drain(backend, args.profile, args.sort)
        return 0
    if args.row_writes:
        for name in args.backend:
            with benchlib.fresh_backend(name) as backend:
                benchlib.create_target(backend, max_concurrent=BATCH * max(args.workers))
                for k in args.workers:
                    row_write_waits(backend, k, args.count or DEFAULT_COUNTS[name])
        return 0
    results = []
    for name in args.backend:
        results += measure(name, args.workers, args.count or DEFAULT_COUNTS[name],
                           args.rounds, args.books)
    _print_results(results)
    return 0


def _print_environment(backends: list[str]) -> None:
    rows = benchlib.environment(backends)
    benchlib.print_table("environment", ["item", "value"], [list(r) for r in rows])


def _print_results(results: list[Result]) -> None:
    rows = [[r.backend, r.workers, r.round, r.floor_rate, r.engine_rate,
             f"{100 * r.ratio:.0f}%", r.floor_seconds, r.engine_seconds,
             f"{1000 * r.pickup:.0f}", f"{r.load:.1f}"]
            for r in results]
    benchlib.print_table(
        f"claim + settle, no-op target (claim batch 16), {results[0].deliveries:,} "
        "deliveries, deliveries per second, each round",
        ["backend", "processes", "round", "floor/s", "engine/s", "engine/floor",
         "floor s", "engine s", "pickup ms", "load"], rows)
    summary = []
    for key in dict.fromkeys((r.backend, r.workers) for r in results):
        group = [r for r in results if (r.backend, r.workers) == key]
        ratios = sorted(r.ratio for r in group)
        summary.append([*key, len(group), statistics.median(r.floor_rate for r in group),
                        statistics.median(r.engine_rate for r in group),
                        f"{100 * statistics.median(ratios):.0f}%",
                        f"{100 * ratios[0]:.0f}-{100 * ratios[-1]:.0f}%"])
    benchlib.print_table(
        "median of the rounds (engine/floor: median of the per-round ratios)",
        ["backend", "processes", "rounds", "floor/s", "engine/s", "engine/floor", "range"],
        summary)
    booked = [r for r in results if r.books_rate is not None]
    if booked:
        rows = []
        for key in dict.fromkeys((r.backend, r.workers) for r in booked):
            group = [r for r in booked if (r.backend, r.workers) == key]
            of_floor = sorted(r.books_rate / r.floor_rate for r in group)
            engine_of = sorted(r.engine_rate / r.books_rate for r in group)
            rows.append([*key, len(group), statistics.median(r.books_rate for r in group),
                         f"{100 * statistics.median(of_floor):.0f}%",
                         f"{100 * of_floor[0]:.0f}-{100 * of_floor[-1]:.0f}%",
                         f"{100 * statistics.median(engine_of):.0f}%"])
        benchlib.print_table(
            "the floor with statuses and history lines (--books), median of the rounds",
            ["backend", "processes", "rounds", "with lines/s", "of the floor", "range",
             "engine of it"], rows)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average after the run: {load}")


if __name__ == "__main__":
    sys.exit(main())
