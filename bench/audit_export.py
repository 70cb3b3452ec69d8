"""The audit export of 100,000 history lines as CSV and as JSON Lines: its time and the
peak memory (RSS) of the process serving it.

    python bench/audit_export.py --backend postgres --lines 100000
    python bench/audit_export.py --backend embedded --lines 100000 --lines 10000

On a fresh database: ``--lines`` history lines (configuration changes, operator
actions and message lines, each with a JSON ``data``), bulk-loaded with one INSERT
... SELECT. Each export then runs in a process of its own (spawned: nothing of the
loading in its memory), which builds the app, takes ``GET /api/v1/audit`` through the
test client and reads the streamed body chunk by chunk, counting lines and bytes.

Printed per format and size: lines, bytes, seconds, the process's RSS before the
call and its peak (``ru_maxrss``) after it: a constant-memory export has the same peak
for 10,000 and 100,000 lines. Also the ``audit_exported`` line each export wrote.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from datetime import timedelta

from benchlib import analyze, environment, fresh_backend, make_app, print_table
from sqlalchemy import text

TYPES = ("config_changed", "redeliver_requested", "delivery_changed", "received")


def load(conn, n: int, first_id: int, now) -> None:
    if conn.dialect.name == "postgresql":
        numbers = "s AS (SELECT i FROM generate_series(1, :n) AS g(i))"
        data = "json_build_object('n', i, 'state', 'delivered')"
    else:
        numbers = "RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)"
        data = "json_object('n', i, 'state', 'delivered')"
    kinds = " ".join(f"WHEN {k} THEN '{t}'" for k, t in enumerate(TYPES))
    conn.execute(text(f"""WITH {numbers}
        INSERT INTO history (id, message_id, delivery_id, type, actor, text, data,
                             created_at)
        SELECT :first + i, CASE WHEN i % 4 > 1 THEN i END, CASE WHEN i % 4 = 2 THEN i END,
               CASE i % 4 {kinds} END, CASE WHEN i % 4 < 2 THEN 'ops' || (i % 7) ELSE '' END,
               'line ' || i || ': acme, "quoted", changed', {data}, :at FROM s"""),
                 {"n": n, "first": first_id, "at": now.isoformat(sep=" ")})


def export(database_url: str, broker_url: str, data_dir: str, token: str, since: str,
           until: str, fmt: str, queue) -> None:
    """In its own process: the export's lines, bytes, seconds and RSS (KiB)."""
    from benchlib import Backend
    app = make_app(Backend("x", database_url, broker_url, data_dir))
    client = app.test_client()
    client.get("/api/v1/stats?series=none", headers={"Authorization": f"Bearer {token}"})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    answer = client.get(f"/api/v1/audit?since={since}&until={until}&format={fmt}",
                        headers={"Authorization": f"Bearer {token}"}, buffered=False)
    lines = size = 0
    for chunk in answer.response:
        size += len(chunk)
        lines += chunk.count(b"\n")
    answer.close()
    seconds = time.perf_counter() - t0
    queue.put((answer.status_code, lines, size, seconds, before,
               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres", "embedded"), default="postgres")
    parser.add_argument("--lines", type=int, action="append")
    args = parser.parse_args()
    sizes = args.lines or [100_000]
    from b2bhub.models import utcnow
    from b2bhub.services.tokens import create_token

    rows, recorded = [], []
    spawn = multiprocessing.get_context("spawn")
    with fresh_backend(args.backend) as backend:
        engine = backend.engine()
        app = make_app(backend)
        with app.app_context():
            session = app.extensions["sqlalchemy"].session
            token = create_token(session, "bench", "admin")
            session.commit()
        base = utcnow() - timedelta(days=len(sizes) + 1)
        periods, first = [], 0
        for k, n in enumerate(sizes):  # each size a day of its own
            at = base + timedelta(days=k)
            with engine.begin() as conn:
                load(conn, n, first, at)
            first += n
            periods.append((at, at + timedelta(hours=1)))
        if engine.dialect.name == "postgresql":
            with engine.begin() as conn:
                conn.execute(text("SELECT setval(pg_get_serial_sequence('history', 'id'), "
                                  "(SELECT max(id) FROM history))"))
        analyze(engine)
        for n, (since, until) in zip(sizes, periods, strict=True):
            for fmt in ("csv", "jsonl"):
                queue = spawn.Queue()
                proc = spawn.Process(target=export, args=(
                    backend.database_url, backend.broker_url, backend.data_dir, token,
                    since.isoformat() + "Z", until.isoformat() + "Z", fmt, queue))
                proc.start()
                status, lines, size, seconds, before, peak = queue.get(timeout=600)
                proc.join()
                assert status == 200, status
                rows.append([fmt, f"{n:,}", f"{lines:,}", f"{size / 1e6:.1f} MB",
                             f"{seconds:.2f}", f"{before / 1024:.1f}",
                             f"{peak / 1024:.1f}", f"{(peak - before) / 1024:.1f}"])
        with engine.connect() as conn:
            recorded = conn.execute(text("SELECT id, actor, text FROM history "
                                         "WHERE type = 'audit_exported' ORDER BY id")).all()
        engine.dispose()
    print_table("environment", ["what", "value"], [list(r) for r in environment(
        [args.backend])])
    print(f"\ncommand: python {' '.join(sys.argv)}")
    print_table("audit export", ["format", "lines in period", "text lines", "size",
                                 "seconds", "RSS before (MiB)", "peak RSS (MiB)",
                                 "growth (MiB)"], rows)
    print("\nthe exports' own lines:")
    for line in recorded:
        print(f"  {line.id} ({line.actor}) {line.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
