"""Latency of the message and delivery lists with 1M messages stored.

    python bench/api_list.py --backend postgres --messages 1000000
    python bench/api_list.py --backend embedded --messages 1000000

On a fresh database with the migrated schema: N messages over 30 days from 20 partners,
1% error, 2% retrying, the rest delivered, each with one delivery to one of 5 targets
(bulk-loaded: generate_series on PostgreSQL, a recursive CTE on SQLite), then VACUUM
ANALYZE. Each query is then asked ``--requests`` times (after 5 untimed) through the
whole Flask stack in-process (test client: bearer token check, argument parsing, the
query, marshmallow serialization of 50 items), without a network hop; p50 and p99 of
the wall time per request (``q`` reads every row: 10 requests). ``--explain`` prints
the plan of each list query.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timedelta

import benchlib
from sqlalchemy import event, text

PARTNERS = 20
TARGETS = 5
DAYS = 30


def utcnow() -> datetime:
    from b2bhub.models import utcnow as now
    return now()


def load(engine, n: int, now: datetime) -> float:
    """N messages and one delivery each; seconds it took (with VACUUM ANALYZE)."""
    began = time.perf_counter()
    spacing = DAYS * 86400 / n
    postgres = engine.dialect.name == "postgresql"
    seconds = ("make_interval(secs => (:n - i) * :spacing)" if postgres else None)
    with engine.begin() as conn:
        numbers = benchlib._numbers(conn)
        created = (f"CAST(:now AS timestamp) - {seconds}" if postgres else
                   "strftime('%Y-%m-%d %H:%M:%f', :now, '-' || ((:n - i) * :spacing) "
                   "|| ' seconds')")
        conn.execute(benchlib._timed(f"""WITH {numbers}
            INSERT INTO messages (id, source, from_party, to_party, direction,
                                  original_filename, external_id, sequence_key, size,
                                  sha256, status, status_text, created_at, updated_at)
            SELECT i, 'inbox', 'partner' || (i % {PARTNERS}), 'mycompany', 'inbound',
                   'order_' || i || '.edi', 'EXT-' || i, NULL, 2048, NULL,
                   CASE WHEN i % 100 = 0 THEN 'error' WHEN i % 50 = 0 THEN 'retrying'
                        ELSE 'delivered' END, '', {created}, {created} FROM s"""),
                     {"n": n, "now": now, "spacing": spacing})
        conn.execute(text(f"""INSERT INTO deliveries (message_id, target, state, attempt,
                failures, wake_count, last_result, created_at, updated_at)
            SELECT id, 'writer' || (id % {TARGETS}),
                   CASE status WHEN 'error' THEN 'failed' WHEN 'retrying' THEN 'retrying'
                               ELSE 'delivered' END, 1, 0, 0, '', created_at, updated_at
              FROM messages"""))
        if postgres:
            for table in ("messages", "deliveries"):
                conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                  f"(SELECT max(id) FROM {table}))"))
    benchlib.analyze(engine)
    return time.perf_counter() - began


def queries(n: int, now: datetime, cursor: str) -> list[tuple[str, str]]:
    week_ago = (now - timedelta(days=7)).strftime("%Y-%m-%dT%H:%M:%SZ")
    day_before = (now - timedelta(days=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [
        ("messages: first page", "/api/v1/messages"),
        ("messages: page after 10,000", f"/api/v1/messages?cursor={cursor}"),
        ("messages: status=error", "/api/v1/messages?status=error"),
        ("messages: status=error&from=partner0", "/api/v1/messages?status=error&from=partner0"),
        ("messages: from=partner7", "/api/v1/messages?from=partner7"),
        ("messages: one day a week ago", f"/api/v1/messages?since={day_before}"
                                         f"&until={week_ago}"),
        ("messages: target=writer3", "/api/v1/messages?target=writer3"),
        ("messages: q=EXT-<id> (reads every row)", f"/api/v1/messages?q=EXT-{n // 2}"),
        ("deliveries: first page", "/api/v1/deliveries"),
        ("deliveries: state=failed", "/api/v1/deliveries?state=failed"),
        ("deliveries: state=failed&from=partner0",
         "/api/v1/deliveries?state=failed&from=partner0"),
    ]


def measure(client, headers: dict, url: str, requests: int) -> list[float]:
    times = []
    for index in range(requests + 5):
        began = time.perf_counter()
        response = client.get(url, headers=headers)
        took = (time.perf_counter() - began) * 1000
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {response.get_data()[:300]}")
        if index >= 5:
            times.append(took)
    return times


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def explain(engine, app, client, headers: dict, url: str) -> None:
    """The plan of the list query ``url`` runs (its last SELECT)."""
    seen: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "LIMIT" in statement.upper():
            seen.append((statement, parameters))

    sql_engine = app.extensions["sqlalchemy"].engines[None]
    event.listen(sql_engine, "before_cursor_execute", record)
    try:
        client.get(url, headers=headers)
    finally:
        event.remove(sql_engine, "before_cursor_execute", record)
    statement, params = seen[-1]
    prefix = "EXPLAIN ANALYZE " if engine.dialect.name == "postgresql" else \
        "EXPLAIN QUERY PLAN "
    with engine.connect() as conn:
        raw = conn.connection.driver_connection.cursor()
        raw.execute(prefix + statement, params)
        print(f"\n{url}")
        for row in raw.fetchall():
            print("    " + " ".join(str(c) for c in row))


def run(name: str, n: int, requests: int, show_plans: bool) -> list[list[object]]:
    with benchlib.fresh_backend(name) as backend:
        engine = backend.engine()
        now = utcnow()
        took = load(engine, n, now)
        print(f"{name}: loaded {n:,} messages and deliveries in {took:.0f} s", flush=True)
        app = benchlib.make_app(backend)
        rows = []
        with app.app_context():
            from b2bhub.config.extensions import db
            from b2bhub.services.tokens import create_token
            token = create_token(db.session, "bench", "viewer")
            db.session.commit()
            headers = {"Authorization": f"Bearer {token}"}
            client = app.test_client()
            cursor = client.get("/api/v1/messages?limit=500", headers=headers)
            for _ in range(19):
                cursor = client.get("/api/v1/messages?limit=500&cursor="
                                    f"{cursor.get_json()['next_cursor']}", headers=headers)
            after = cursor.get_json()["next_cursor"]
            for label, url in queries(n, now, after):
                # q reads the whole table: fewer requests keep the run short
                times = measure(client, headers, url, 10 if "q=" in url else requests)
                rows.append([f"{name}: {label}", round(statistics.median(times), 1),
                             round(percentile(times, 99), 1), round(max(times), 1)])
                print("  ".join(str(c) for c in rows[-1]), flush=True)
            if show_plans:
                for _label, url in queries(n, now, after):
                    explain(engine, app, client, headers, url)
            app.extensions["sqlalchemy"].engines[None].dispose()
        engine.dispose()
        return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", nargs="+", choices=benchlib.BACKENDS,
                        default=["postgres"])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args(argv)
    for key, value in benchlib.environment(args.backend):
        print(f"{key}: {value}")
    rows = []
    for name in args.backend:
        rows += run(name, args.messages, args.requests, args.explain)
    benchlib.print_table(f"GET list latency, {args.messages:,} messages, "
                         f"{args.requests} requests each (ms)",
                         ["query", "p50", "p99", "max"], rows)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
