"""Why every PostgreSQL connection of the hub discards its cached plans once they are
a few seconds old (``REPLAN_SECONDS``, :mod:`b2bhub.config.database`) instead of planning
each execution (``plan_cache_mode=force_custom_plan``, as it did before), and what
planning each execution costs in the foreign-key checks of its INSERTs.

    python bench/plan_cache.py [--parents 300000] [--rows 64]

In a database of its own (``b2bhub_bench_<pid>``, dropped at the end), on connections
that never prepare a statement (psycopg ``prepare_threshold=None``: each statement of
the script is planned for its own parameters whatever the setting), so what the setting
moves is PostgreSQL's own cached plans: those of the foreign-key checks an INSERT runs
per row.

1. **The trap** that default plan caching sets for a table that was vacuumed while
   empty: a parent table and a child table with a foreign key to it, the parent
   vacuumed while empty (as autovacuum or an operator's VACUUM does), then one INSERT of
   a parent and a child at a time, 20 times (the check's plan is cached generic after
   five executions), then ``--parents`` more parent rows and 200 more INSERTs on the
   same connection: ms per INSERT before and after the growth, in each mode. With the
   default (``auto``), the check keeps the plan made for an empty table (a sequential
   scan) until something replans it; ``auto, replanned`` discards the connection's
   plans after the growth (``DISCARD PLANS``), as the hub's next checkout of it does.
2. **The price** of planning each check: a child table of ``--rows`` rows per INSERT
   (as a claimed batch writes 64 history lines) with a foreign key to a 1,000-row
   parent, and the same INSERT with the key left NULL (no check), 300 times each: ms
   per INSERT in each mode, alternating the modes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import benchlib
import psycopg
from sqlalchemy import create_engine, make_url, text

#: the modes measured: PostgreSQL's setting, and whether the connection discards its
#: cached plans after the growth, as the hub's next checkout does once they are
#: ``REPLAN_SECONDS`` old (b2bhub.config.database)
MODES = {"force_custom_plan": ("force_custom_plan", False), "auto": ("auto", False),
         "auto, replanned": ("auto", True)}


def connect(url: str, mode: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, prepare_threshold=None,
                           options=f"-c plan_cache_mode={MODES[mode][0]}")


def parent_and_child(conn: psycopg.Connection, name: str) -> None:
    """New tables ``<name>_parent`` and ``<name>_child``, a foreign key from the child."""
    conn.execute(f"DROP TABLE IF EXISTS {name}_child; DROP TABLE IF EXISTS {name}_parent")
    conn.execute(f"CREATE TABLE {name}_parent (id bigserial PRIMARY KEY, x int)")
    conn.execute(f"CREATE TABLE {name}_child (id bigserial PRIMARY KEY, "
                 f"parent_id bigint REFERENCES {name}_parent (id), y int)")


def trap(url: str, mode: str, parents: int) -> tuple[float, float]:
    with connect(url, mode) as conn:
        parent_and_child(conn, "trap")
        conn.execute("VACUUM ANALYZE trap_parent")

        def per_insert(count: int) -> float:
            started = time.perf_counter()
            for _ in range(count):
                conn.execute("WITH p AS (INSERT INTO trap_parent (x) VALUES (1) RETURNING id) "
                             "INSERT INTO trap_child (parent_id, y) SELECT id, 1 FROM p")
            return (time.perf_counter() - started) / count * 1000

        before = per_insert(20)
        conn.execute("INSERT INTO trap_parent (x) SELECT g FROM generate_series(1, %s) g",
                     (parents,))
        if MODES[mode][1]:
            conn.execute("DISCARD PLANS")
        after = per_insert(200)
        conn.execute("DROP TABLE trap_child; DROP TABLE trap_parent")
    return before, after


def price(url: str, mode: str, rows: int) -> tuple[float, float]:
    with connect(url, mode) as conn:
        parent_and_child(conn, "price")
        conn.execute("INSERT INTO price_parent (x) SELECT g FROM generate_series(1, 1000) g")
        checked = ("INSERT INTO price_child (parent_id, y) "
                   f"SELECT (g % 1000) + 1, 1 FROM generate_series(1, {rows}) g")
        unchecked = ("INSERT INTO price_child (parent_id, y) "
                     f"SELECT NULL, 1 FROM generate_series(1, {rows}) g")
        figures = []
        for sql in (checked, unchecked):
            for _ in range(20):
                conn.execute(sql)
            started = time.perf_counter()
            for _ in range(300):
                conn.execute(sql)
            figures.append((time.perf_counter() - started) / 300 * 1000)
        conn.execute("DROP TABLE price_child; DROP TABLE price_parent")
    return figures[0], figures[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parents", type=int, default=300_000)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for name, value in benchlib.environment(["postgres"]):
        print(f"{name}: {value}")
    db_name = f"b2bhub_bench_{os.getpid()}"
    admin = create_engine(benchlib.PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{db_name}"'))
    url = make_url(benchlib.PG_ADMIN_URL).set(drivername="postgresql", database=db_name)
    dsn = url.render_as_string(hide_password=False)
    modes = tuple(MODES)
    try:
        print(f"\n1. the trap: a parent vacuumed while empty, then {args.parents:,} more "
              "parents on the same connection (ms per INSERT of a parent and a child)")
        for mode in modes:
            before, after = trap(dsn, mode, args.parents)
            print(f"  {mode:18} first 20: {before:7.3f}   after the growth: {after:7.3f}")
        print(f"\n2. the price: an INSERT of {args.rows} child rows, each checked against "
              f"a 1,000-row parent, and the same with no check (ms per INSERT; "
              f"{args.rounds} rounds, the modes alternating)")
        results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode in modes:
                results[mode].append(price(dsn, mode, args.rows))
        for mode in modes:
            checked = statistics.median(r[0] for r in results[mode])
            unchecked = statistics.median(r[1] for r in results[mode])
            print(f"  {mode:18} checked {checked:6.3f}   unchecked {unchecked:6.3f}   "
                  f"the checks: {(checked - unchecked) * 1000 / args.rows:5.1f} us a row")
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
        admin.dispose()
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
