"""Sweep duration as the table of finished deliveries grows, with the same 100 due.

    python bench/sweep.py --backend postgres --sizes 10000 100000 1000000
    python bench/sweep.py --backend embedded --sizes 10000 100000 1000000

On a fresh database with the migrated schema: 100 queued deliveries whose next wake-up
is past, then 10k, 100k, 1M delivered ones (bulk-loaded: generate_series on PostgreSQL,
a recursive CTE on SQLite), ANALYZE, and ``run_sweep`` timed several times per size
(median; before each run the 100 due rows are made due again, untimed). The wake-ups it
queues are dropped: this measures the database work, not the broker. At the largest
size the sweep's statements on ``deliveries`` are captured and explained (PostgreSQL
EXPLAIN ANALYZE, rolled back; SQLite EXPLAIN QUERY PLAN) to show which index each uses.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timedelta

import benchlib
from benchlib import Backend
from sqlalchemy import event, text
from sqlalchemy.orm import Session

DUE = 100


def utcnow() -> datetime:
    from b2bhub.models import utcnow as now
    return now()


# --- loading --------------------------------------------------------------------------

def load_due(engine, count: int) -> list[int]:
    """``count`` queued deliveries, woken once, their next wake-up past."""
    now = utcnow()
    with engine.begin() as conn:
        first = benchlib.bulk_messages(conn, count, now, "received", payloads=False)
        benchlib.bulk_deliveries(conn, first, "queued", now, due_at=now - timedelta(hours=1),
                                 next_wake_at=now - timedelta(minutes=1))
        return list(conn.execute(text("SELECT id FROM deliveries WHERE state = 'queued' "
                                      "ORDER BY id")).scalars())


def load_not_due(engine, count: int) -> None:
    """``count`` in-flight deliveries that are not due: half in progress with a live
    lease, half awaiting a receipt whose deadline is ahead. The sweep must pass them
    by on the second column of its indexes, not read them."""
    now = utcnow()
    ahead = now + timedelta(hours=1)
    with engine.begin() as conn:
        for state in ("in_progress", "awaiting_receipt"):
            first = benchlib.bulk_messages(conn, count // 2, now, state, payloads=False)
            benchlib.bulk_deliveries(conn, first, state, now, due_at=now, next_wake_at=None,
                                     attempt=1)
        conn.execute(benchlib._timed(
            "UPDATE deliveries SET lease_owner = 'elsewhere', lease_until = :until "
            "WHERE state = 'in_progress'"), {"until": ahead})
        conn.execute(benchlib._timed(
            "UPDATE deliveries SET receipt_deadline = :until, receipt_ref = 'r' "
            "WHERE state = 'awaiting_receipt'"), {"until": ahead})


def grow_finished(engine, count: int) -> float:
    """Add ``count`` delivered deliveries (and their messages); seconds it took."""
    began = time.perf_counter()
    now = utcnow()
    past = now - timedelta(days=1)
    with engine.begin() as conn:
        first = benchlib.bulk_messages(conn, count, past, "delivered", payloads=False)
        benchlib.bulk_deliveries(conn, first, "delivered", past, due_at=past,
                                 next_wake_at=None, settled_at=past, attempt=1)
    benchlib.analyze(engine)
    return time.perf_counter() - began


def make_due_again(engine, ids: list[int]) -> None:
    """Undo what the last sweep did to the due rows (it counted a wake-up on each)."""
    stmt = benchlib._timed("UPDATE deliveries SET next_wake_at = :past, wake_count = 1 "
                           "WHERE state = 'queued' AND id BETWEEN :lo AND :hi")
    with engine.begin() as conn:
        conn.execute(stmt, {"past": utcnow() - timedelta(minutes=1), "lo": ids[0],
                            "hi": ids[-1]})


# --- timing ---------------------------------------------------------------------------

def time_sweeps(engine, due: list[int], runs: int) -> list[float]:
    """Milliseconds of each of ``runs`` sweeps (after one untimed warm-up)."""
    from b2bhub.engine.sweep import run_sweep
    times = []
    for index in range(runs + 1):
        make_due_again(engine, due)
        with Session(engine, expire_on_commit=False) as session:
            began = time.perf_counter()
            report = run_sweep(session, utcnow(), "bench-sweep")
            took = (time.perf_counter() - began) * 1000
        if not report.ran or report.woken == 0:
            raise RuntimeError(f"the sweep did not wake the due deliveries: {report}")
        if index:
            times.append(took)
    return times


# --- plans ----------------------------------------------------------------------------

def capture_statements(engine, due: list[int]) -> list[tuple[str, object]]:
    """The statements one sweep sends that read or write ``deliveries``."""
    from b2bhub.engine.sweep import run_sweep
    seen: dict[str, object] = {}

    def record(conn, cursor, statement, parameters, context, executemany):
        if "deliveries" in statement and statement not in seen:
            seen[statement] = parameters[0] if executemany else parameters

    make_due_again(engine, due)
    event.listen(engine, "before_cursor_execute", record)
    try:
        with Session(engine, expire_on_commit=False) as session:
            run_sweep(session, utcnow(), "bench-sweep")
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return list(seen.items())


def explain(engine, statements: list[tuple[str, object]], due: list[int]) -> list[str]:
    """Print each statement's plan; returns those that scan ``deliveries`` whole."""
    full_scans = []
    make_due_again(engine, due)
    for statement, params in statements:
        plan = _plan(engine, statement, params)
        print("\n" + " ".join(statement.split()))
        print("\n".join("    " + line for line in plan))
        if _full_scan(engine, plan):
            full_scans.append(" ".join(statement.split())[:80])
    return full_scans


def _plan(engine, statement: str, params) -> list[str]:
    postgres = engine.dialect.name == "postgresql"
    prefix = "EXPLAIN (ANALYZE, COSTS OFF) " if postgres else "EXPLAIN QUERY PLAN "
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(prefix + statement, params).all()
        conn.rollback()  # EXPLAIN ANALYZE ran an UPDATE: leave nothing behind
    if postgres:
        return [r[0] for r in rows]
    return [f"{'  ' * _depth(rows, r)}{r[-1]}" for r in rows]


def _depth(rows, row) -> int:
    parents = {r[0]: r[1] for r in rows}
    depth, parent = 0, row[1]
    while parent in parents:
        depth, parent = depth + 1, parents[parent]
    return depth


def _full_scan(engine, plan: list[str]) -> bool:
    if engine.dialect.name == "postgresql":
        return any("Seq Scan on deliveries" in line for line in plan)
    return any(line.strip().startswith("SCAN deliveries") and "INDEX" not in line
               for line in plan)


# --- main -----------------------------------------------------------------------------

def measure(name: str, sizes: list[int], runs: int, not_due: int) -> list[list[object]]:
    from b2bhub.engine import wakeups
    wakeups.set_publisher(None)
    rows = []
    with benchlib.fresh_backend(name) as backend:
        benchlib.create_target(backend, max_concurrent=4)
        engine = backend.engine()
        due = load_due(engine, DUE)
        load_not_due(engine, not_due)
        have = 0
        for size in sorted(sizes):
            load = grow_finished(engine, size - have)
            have = size
            times = time_sweeps(engine, due, runs)
            print(f"[{name}] {size:,} finished + {DUE} due: loaded in {load:.1f} s, sweep "
                  f"median {statistics.median(times):.2f} ms", flush=True)
            rows.append([name, size, DUE, statistics.median(times), min(times), max(times)])
        _print_plans(backend, engine, due, max(sizes))
        engine.dispose()
    return rows


def _print_plans(backend: Backend, engine, due: list[int], size: int) -> None:
    kind = "EXPLAIN ANALYZE" if backend.postgres else "EXPLAIN QUERY PLAN"
    print(f"\n{kind} of the sweep's statements on deliveries ({backend.name}, "
          f"{size:,} finished + {DUE} due)")
    full_scans = explain(engine, capture_statements(engine, due), due)
    if full_scans:
        print("\nWARNING: full scans of deliveries:\n  " + "\n  ".join(full_scans))
    else:
        print("\nevery statement reaches deliveries through an index")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", nargs="+", choices=benchlib.BACKENDS,
                        default=["embedded"])
    parser.add_argument("--sizes", nargs="+", type=int,
                        default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=15, help="timed sweeps per size")
    parser.add_argument("--not-due", type=int, default=1000,
                        help="in-flight deliveries the sweep must pass by (half in progress, "
                             "half awaiting a receipt)")
    args = parser.parse_args(argv)
    benchlib.print_table("environment", ["item", "value"],
                         [list(r) for r in benchlib.environment(args.backend)])
    rows = []
    for name in args.backend:
        rows += measure(name, args.sizes, args.runs, args.not_due)
    _print_results(rows, args.runs)
    return 0


def _print_results(rows: list[list[object]], runs: int) -> None:
    benchlib.print_table(
        f"sweep duration, ms (median, min, max of {runs} runs)",
        ["backend", "finished", "due", "median ms", "min ms", "max ms"], rows)
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        small, large = mine[0], mine[-1]
        ratio = large[3] / small[3]
        print(f"{name}: {large[1]:,} / {small[1]:,} finished = {ratio:.2f}x "
              f"(goal: within 1.5x)")


if __name__ == "__main__":
    sys.exit(main())
