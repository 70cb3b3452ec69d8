"""A partner's scorecard with a million messages: the time of ``GET
/api/v1/partners/<name>/scorecard`` over 90 days, and of the daily fold behind it.

    python bench/scorecard.py --backend postgres --messages 1000000
    python bench/scorecard.py --backend embedded --messages 100000

On a fresh database: ``--messages`` outbound messages to one partner, spread evenly
over the last 90 days (ids growing with time, as the hub writes them), each with one
delivery: 90 % delivered at the first attempt (0-49 s after receipt), 5 % after
retries, 3 % failed (technical), 1 % failed (business), 1 % retrying; a third waited
for a receipt. Bulk-loaded with one INSERT ... SELECT each (generate_series), then
VACUUM ANALYZE. Then the daily fold (``roll_up``, as the housekeeping runs it, all
days at once here), and the scorecard through the API ``--repeat`` times.

Printed: the fold's time, the scorecard's times (first and median), how many rows it
read from the stored days and how many messages it counted from the rows (the days
not yet folded), the command and the load average.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta

from benchlib import analyze, environment, fresh_backend, make_app, print_table
from sqlalchemy import text

PARTNER = "acme"


def load(conn, n: int, now) -> None:
    start = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=89)
    span = (now - start).total_seconds()
    if conn.dialect.name == "postgresql":
        numbers = "s AS (SELECT i FROM generate_series(1, :n) AS g(i))"
        at = "(CAST(:start AS timestamp) + (i * :step) * interval '1 second')"
        plus = "({at} + (i % 50) * interval '1 second')"
    else:
        numbers = "RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)"
        at = "strftime('%Y-%m-%d %H:%M:%f', :start, '+' || (i * :step) || ' seconds')"
        plus = "strftime('%Y-%m-%d %H:%M:%f', {at}, '+' || (i % 50) || ' seconds')"
    params = {"n": n, "start": start.isoformat(sep=" "), "step": span / (n + 1)}
    conn.execute(text("INSERT INTO parties (name, kind, display_name, functional_acks, "
                      "created_at) VALUES (:p, 'partner', :p, 'none', :now)"),
                 {"p": PARTNER, "now": now.isoformat(sep=" ")})
    t0 = time.perf_counter()
    conn.execute(text(f"""WITH {numbers}
        INSERT INTO messages (id, source, from_party, to_party, direction, size, status,
                              status_text, created_at, updated_at)
        SELECT i, 'erp', 'hub', :p, 'outbound', 1000 + i % 1000, 'delivered', '',
               {at}, {at} FROM s"""), {**params, "p": PARTNER})
    conn.execute(text(f"""WITH {numbers}
        INSERT INTO deliveries (message_id, target, state, failure_kind, attempt, failures,
                                wake_count, receipt_ref, last_result, created_at,
                                updated_at, settled_at)
        SELECT i, 'as2out',
               CASE WHEN i % 100 < 95 THEN 'delivered' WHEN i % 100 < 99 THEN 'failed'
                    ELSE 'retrying' END,
               CASE WHEN i % 100 = 98 THEN 'business'
                    WHEN i % 100 BETWEEN 95 AND 97 THEN 'technical' END,
               CASE WHEN i % 100 BETWEEN 90 AND 94 THEN 2 ELSE 1 END, 0, 0,
               CASE WHEN i % 3 = 0 THEN 'r' || i END, '', {at}, {at},
               CASE WHEN i % 100 < 99 THEN {plus.format(at=at)} END FROM s"""), params)
    if conn.dialect.name == "postgresql":
        for table in ("messages", "deliveries"):
            conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                              f"(SELECT max(id) FROM {table}))"))
    print(f"loaded {n:,} messages and deliveries in {time.perf_counter() - t0:.1f} s",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres", "embedded"), default="postgres")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from b2bhub.models import utcnow
    from b2bhub.services import scorecard
    from b2bhub.services.tokens import create_token

    with fresh_backend(args.backend) as backend:
        engine = backend.engine()
        now = utcnow()
        with engine.begin() as conn:
            load(conn, args.messages, now)
        analyze(engine)
        app = make_app(backend)
        with app.app_context():
            session = app.extensions["sqlalchemy"].session
            t0 = time.perf_counter()
            days = scorecard.roll_up(session, now, limit=100)
            session.commit()
            fold = time.perf_counter() - t0
            token = create_token(session, "bench", "admin")
            session.commit()
            stored = session.execute(text("SELECT count(*) FROM scorecard_days")).scalar()
            live = session.execute(text(
                "SELECT count(*) FROM messages WHERE created_at >= :since"),
                {"since": scorecard.rolled_through(session) + timedelta(days=1)}).scalar()
        analyze(engine)
        client = app.test_client()
        times, body = [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            answer = client.get(f"/api/v1/partners/{PARTNER}/scorecard?days=90",
                                headers={"Authorization": f"Bearer {token}"})
            times.append(time.perf_counter() - t0)
            assert answer.status_code == 200, answer.text
            body = answer.json
        engine.dispose()
    total = body["totals"]["outbound"]
    print_table("environment", ["what", "value"], [list(r) for r in environment(
        [args.backend])])
    print_table("scorecard over 90 days", ["figure", "value"], [
        ["command", "python " + " ".join(sys.argv)],
        ["messages of the partner", f"{args.messages:,}"],
        ["daily fold of 87 days (roll_up)", f"{fold:.1f} s ({days} days)"],
        ["stored day rows read", stored],
        ["messages counted from rows (the last 3 days)", f"{live:,}"],
        ["scorecard, first call", f"{times[0] * 1000:.0f} ms"],
        [f"scorecard, median of {args.repeat}", f"{statistics.median(times) * 1000:.0f} ms"],
        ["messages in the answer", f"{total['messages']:,}"],
        ["delivered first time / after retries",
         f"{total['delivered_first_time']:,} / {total['delivered_after_retries']:,}"],
        ["median / p95 (bucket bounds, s)",
         f"{total['median_seconds']} / {total['p95_seconds']}"],
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
