"""The nightly cleanup with intake running: its rate, its longest transaction, and the
intake's latency before and during it, in the same run.

    python bench/cleanup.py --backend postgres --messages 1000000 --rate 200 [--batch 500]
    python bench/cleanup.py --backend embedded --messages 100000 --rate 50
    python bench/cleanup.py --backend postgres --messages 1000000 --report-only

On a fresh database: ``--messages`` delivered messages created 40 days ago (bulk-loaded,
each with a payload row, a delivery and three history lines; the payload rows share one
digest, so this measures the database work, not file removal), ANALYZE. Then an intake
thread stores a message (a payload file put, then ``store_and_dispatch`` routed to the
no-op target, then commit) every 1/``--rate`` s: ``--before`` seconds alone, then while
the cleanup runs in a process of its own (``run_cleanup``, the code beat runs).

Printed: the messages removed per second (from the run's own record), the longest and
the median transaction the cleanup held (from SQLAlchemy's begin/commit events in the
cleanup process: on PostgreSQL a row lock is held until the end of its transaction, so
the longest transaction bounds the longest lock), the storage report's time on the
database as loaded, and the intake's p50/p99 latency before and during the cleanup.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
from datetime import timedelta

import benchlib
from sqlalchemy import event, text


def load(engine, count: int) -> None:
    from b2bhub.models import utcnow
    past = utcnow() - timedelta(days=40)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO plugin_instances (name, type, enabled, config, "
                          "max_concurrent_deliveries, ordered, probe_interval, state, "
                          "state_reason, created_at, updated_at) VALUES ('inbox', "
                          "'manual_source', true, '{}', 4, false, 60, 'enabled', '', "
                          ":now, :now)"), {"now": past})
        conn.execute(text("INSERT INTO routes (source, from_party, to_party, target, "
                          "created_at, created_by) VALUES ('inbox', '*', '*', :t, :now, "
                          "'bench')"), {"t": benchlib.TARGET, "now": past})
        first = benchlib.bulk_messages(conn, count, past, "delivered")
        benchlib.bulk_deliveries(conn, first, "delivered", past, due_at=past,
                                 next_wake_at=None, settled_at=past, attempt=1)
        for kind in ("received", "delivery_changed", "status_changed"):
            conn.execute(benchlib._timed(
                "INSERT INTO history (message_id, type, actor, text, created_at) "
                "SELECT id, :kind, 'bench', :words, :now FROM messages"),
                {"kind": kind, "words": kind, "now": past})


def cleanup_process(backend: benchlib.Backend, batch: int, out) -> None:
    """Run the cleanup with its transactions timed; send back what it measured."""
    from b2bhub.config.extensions import db
    from b2bhub.engine.cleanup import run_cleanup
    from b2bhub.models import utcnow
    from b2bhub.runtime import hub
    app = benchlib.make_app(backend)
    durations: list[float] = []
    with app.app_context():
        started: dict[int, float] = {}

        statements: dict[int, list[str]] = {}
        longest: list = [0.0, []]

        @event.listens_for(db.engine, "begin")
        def _begin(conn):
            started[id(conn)] = time.perf_counter()
            statements[id(conn)] = []

        @event.listens_for(db.engine, "before_cursor_execute")
        def _statement(conn, cursor, statement, *args):
            statements.setdefault(id(conn), []).append(" ".join(statement.split())[:90])

        @event.listens_for(db.engine, "commit")
        def _commit(conn):
            began = started.pop(id(conn), None)
            if began is not None:
                durations.append(time.perf_counter() - began)
                if durations[-1] > longest[0]:
                    longest[:] = [durations[-1], statements.get(id(conn), [])]

        began = time.perf_counter()
        with hub.new_session() as session:
            report = run_cleanup(session, hub.store(), utcnow(), "bench-cleanup",
                                 trigger="manual", actor="bench", batch=batch)
        wall = time.perf_counter() - began
    out.put({"messages": report.messages, "wall": wall, "durations": durations,
             "longest": longest[1]})


class Intake(threading.Thread):
    """Stores one message every 1/rate s; records each one's latency with its phase."""

    def __init__(self, app, rate: float):
        super().__init__(daemon=True)
        self.app, self.interval = app, 1.0 / rate
        self.phase = "before"
        self.samples: dict[str, list[float]] = {"before": [], "during": []}
        self.stop = threading.Event()

    def run(self) -> None:
        from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
        from b2bhub.models import utcnow
        from b2bhub.runtime import hub
        with self.app.app_context():
            store = hub.store()
            i = 0
            next_at = time.perf_counter()
            while not self.stop.is_set():
                phase = self.phase
                began = time.perf_counter()
                stored = store.put(f"order {i} {began}".encode())
                with hub.new_session() as session:
                    store_and_dispatch(session, NewMessage(
                        source="inbox", from_party="acme", to_party="mycompany",
                        stages={"unpacked": (stored.digest, stored.size)},
                        original_filename="order.edi"), utcnow())
                    session.commit()
                if phase in self.samples:
                    self.samples[phase].append(time.perf_counter() - began)
                i += 1
                next_at += self.interval
                time.sleep(max(0.0, next_at - time.perf_counter()))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def storage_report_seconds(backend: benchlib.Backend) -> float:
    from b2bhub.config.extensions import db
    from b2bhub.models import utcnow
    from b2bhub.services.storage import compute
    app = benchlib.make_app(backend)
    with app.app_context():
        compute(db.session, utcnow())  # warm
        began = time.perf_counter()
        compute(db.session, utcnow())
        took = time.perf_counter() - began
        db.session.rollback()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=benchlib.BACKENDS, default="postgres")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--before", type=float, default=15.0)
    parser.add_argument("--batch", type=int, default=500,
                        help="the first batch's size; then sized to 100 ms, as beat runs it")
    parser.add_argument("--report-only", action="store_true",
                        help="time the storage report 3 times on the loaded messages; "
                             "no cleanup, no intake")
    args = parser.parse_args()
    for key, value in benchlib.environment([args.backend]):
        print(f"{key}: {value}")
    with benchlib.fresh_backend(args.backend) as backend:
        benchlib.create_target(backend, 4)
        engine = backend.engine()
        began = time.perf_counter()
        load(engine, args.messages)
        benchlib.analyze(engine)
        print(f"loaded {args.messages} messages in {time.perf_counter() - began:.0f} s")
        report_s = storage_report_seconds(backend)
        if args.report_only:
            times = [report_s] + [storage_report_seconds(backend) for _ in range(2)]
            print(f"storage report on {args.messages} messages: "
                  + ", ".join(f"{t:.2f} s" for t in times))
            return
        intake = Intake(benchlib.make_app(backend), args.rate)
        intake.start()
        time.sleep(args.before)
        intake.phase = "during"
        out = multiprocessing.get_context("spawn").Queue()
        child = multiprocessing.get_context("spawn").Process(
            target=cleanup_process, args=(backend, args.batch, out))
        child.start()
        result = out.get()
        child.join()
        intake.phase = "after"
        intake.stop.set()
        intake.join(10)
        engine.dispose()
    durations = result["durations"]
    before, during = intake.samples["before"], intake.samples["during"]
    benchlib.print_table(f"cleanup of {args.messages} messages, intake at {args.rate}/s", [
        "removed", "wall s", "removed/s", "longest txn ms", "p99 txn ms", "median txn ms",
        "transactions", "storage report s"], [[
            result["messages"], f"{result['wall']:.1f}",
            f"{result['messages'] / result['wall']:.0f}",
            f"{max(durations) * 1000:.0f}", f"{pct(durations, 0.99) * 1000:.0f}",
            f"{statistics.median(durations) * 1000:.1f}",
            len(durations), f"{report_s:.2f}"]])
    benchlib.print_table("intake latency (ms)", ["phase", "messages", "p50", "p99"], [
        [name, len(values), f"{pct(values, 0.5) * 1000:.1f}", f"{pct(values, 0.99) * 1000:.1f}"]
        for name, values in (("before", before), ("during", during))])
    print("the longest transaction's statements:", *result["longest"], sep="\n  ")
    if before and during:
        print(f"intake p99 during / before: {pct(during, 0.99) / pct(before, 0.99):.2f}x")


if __name__ == "__main__":
    main()
