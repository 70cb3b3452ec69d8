"""Many SSE clients on ``GET /api/v1/events`` while messages flow.

    python bench/sse_clients.py --backend embedded postgres --clients 50 --rate 200

For each backend, on a fresh database: a real gunicorn (the Procfile's ``gthread``
worker, ``clients + 8`` threads) and ``--workers`` real Celery workers delivering to the
``noop`` target. ``--clients`` SSE clients (httpx-sse, split over two client processes)
connect, then the benchmark stores ``--rate`` messages per second for ``--seconds``
seconds (one transaction every 50 ms with the messages due by then, as a poller
stores them; woken through the real broker) and waits until every
client has received the last history line (or 60 s more).

Printed per backend: history lines written, whether every client received every line
exactly once and in order, the lag of the events (time of receipt minus the line's
``created_at``, over all clients; the line's time is taken before its transaction
commits, so the lag includes the commit), and ``GET /api/v1/health`` answered while
the streams were open (one probe every 0.5 s from another client), its p99.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import benchlib
import httpx
from benchlib import TARGET, Backend
from httpx_sse import connect_sse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tests.procs import Processes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", nargs="+", choices=benchlib.BACKENDS,
                        default=["embedded"])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=int, default=200, help="messages per second")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    return parser.parse_args()


# --- clients (in processes of their own) ----------------------------------------------

def run_clients(url: str, token: str, count: int, ready, stop, results) -> None:
    """``count`` client threads; puts (ids, lags) of each on ``results`` at the end."""
    out: list[tuple[list[int], list[float]]] = []
    threads = [threading.Thread(target=_client, args=(url, token, ready, stop, out))
               for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(out)


def _client(url, token, ready, stop, out) -> None:
    ids: list[int] = []
    lags: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=30)) as http, \
            connect_sse(http, "GET", "/api/v1/events", params={"after": 0},
                        headers=headers) as source:
        source.response.raise_for_status()
        ready.release()
        for event in source.iter_sse():
            if not event.data:  # httpx-sse hands a keep-alive comment on as an event
                continue
            received = time.time()
            data = json.loads(event.data)
            ids.append(data["id"])
            created = datetime.fromisoformat(data["created_at"].rstrip("Z")).replace(
                tzinfo=UTC).timestamp()
            lags.append(received - created)
            if stop.value and data["id"] >= stop.value:
                break
    out.append((ids, lags))


# --- one backend ------------------------------------------------------------------------

def measure(backend: Backend, args) -> dict:
    from b2bhub.config.extensions import db
    from b2bhub.engine import wakeups
    from b2bhub.engine.dispatch import NewMessage, store_and_dispatch_many
    from b2bhub.models import HistoryLine, utcnow
    from b2bhub.runtime.hub import CeleryPublisher
    from b2bhub.services import config as svc
    from b2bhub.services.tokens import create_token

    app = benchlib.make_app(backend)
    tmp = Path(tempfile.mkdtemp(prefix="b2bhub-sse-"))
    procs = Processes({"database_url": backend.database_url,
                       "broker_url": backend.broker_url, "data_dir": backend.data_dir},
                      tmp)
    with app.app_context():
        registry = app.extensions["b2bhub.plugin.registry"]
        import b2bhub_testplugins as testplugins
        registry.register(testplugins.ManualSource)
        svc.create_party(db.session, "organization", "mycompany")
        svc.create_party(db.session, "partner", "acme")
        svc.save_instance(db.session, registry, {"name": "inbox", "type": "manual_source"})
        svc.save_instance(db.session, registry, {"name": TARGET, "type": "noop",
                                                 "max_concurrent_deliveries": 4})
        svc.create_route(db.session, registry, "inbox", "*", "*", TARGET, actor="bench")
        token = create_token(db.session, "bench", "viewer")
        db.session.commit()
        stored = app.extensions["b2bhub.store"].put(b"ISA*00*sse-bench~")
    wakeups.set_publisher(CeleryPublisher(app).publish)
    try:
        for _ in range(args.workers):
            procs.worker(extra_env={"B2BHUB_LOG_LEVEL": "warning"}, wait=False)
        web = procs.web(threads=args.clients + 8,
                        extra_env={"B2BHUB_LOG_LEVEL": "warning"})
        for proc in procs.procs:
            if proc.name.startswith("worker"):
                proc.wait_in_log(" ready.", timeout=60)

        ctx = multiprocessing.get_context("spawn")
        ready, stop, results = ctx.Semaphore(0), ctx.Value("q", 0), ctx.Queue()
        halves = [args.clients // 2, args.clients - args.clients // 2]
        clients = [ctx.Process(target=run_clients,
                               args=(web.url, token, n, ready, stop, results))
                   for n in halves if n]
        for proc in clients:
            proc.start()
        for _ in range(args.clients):
            if not ready.acquire(timeout=60):
                raise RuntimeError("the clients did not all connect")

        health: list[float] = []
        flowing = threading.Event()
        flowing.set()

        def probe() -> None:
            with httpx.Client(base_url=web.url, timeout=10) as http:
                while flowing.is_set():
                    began = time.perf_counter()
                    http.get("/api/v1/health").raise_for_status()
                    health.append(time.perf_counter() - began)
                    time.sleep(0.5)

        prober = threading.Thread(target=probe)
        prober.start()
        sent = 0
        began = time.monotonic()
        with app.app_context(), Session(db.engine, expire_on_commit=False) as session:
            while time.monotonic() - began < args.seconds:
                due = int((time.monotonic() - began) * args.rate) + 1
                batch = [NewMessage(source="inbox", from_party="acme", to_party="mycompany",
                                    stages={"unpacked": (stored.digest, stored.size)})
                         for _ in range(due - sent)]
                store_and_dispatch_many(session, batch, utcnow())
                session.commit()
                sent += len(batch)
                time.sleep(0.05)
        elapsed = time.monotonic() - began

        with app.app_context():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # until every delivery is settled
                with Session(db.engine) as s:
                    open_ = s.scalar(select(func.count()).select_from(HistoryLine).where(
                        HistoryLine.created_at > utcnow() - timedelta(seconds=1)))
                if not open_:
                    break
                time.sleep(0.5)
            with Session(db.engine) as s:
                last = HistoryLine(type="comment", text="end of the benchmark")
                s.add(last)
                s.commit()
                stop.value = last.id  # the clients stop when this line reaches them
                lines = list(s.scalars(select(HistoryLine.id).order_by(HistoryLine.id)))
        per_client = []
        for _ in clients:
            per_client += results.get(timeout=120)
        for proc in clients:
            proc.join(30)
        flowing.clear()
        prober.join()
    finally:
        procs.stop_all()
        wakeups.set_publisher(None)
        with app.app_context():
            db.engine.dispose()

    complete = sum(ids == lines for ids, _ in per_client)
    lags = sorted(lag for _, each in per_client for lag in each)
    return {"backend": backend.name, "clients": args.clients, "messages": sent,
            "rate": sent / elapsed, "lines": len(lines), "complete": complete,
            "events": len(lags), "lag_p50": _pct(lags, 50), "lag_p99": _pct(lags, 99),
            "lag_max": lags[-1] if lags else None, "health_p99": _pct(sorted(health), 99),
            "health_probes": len(health)}


def _pct(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(len(values) * pct / 100))]


def main() -> None:
    args = parse_args()
    os.environ.setdefault("PYTHONPATH", str(benchlib.ROOT))
    benchlib.print_table("environment", ["item", "value"],
                         [list(r) for r in benchlib.environment(args.backend)])
    rows = []
    for name in args.backend:
        with benchlib.fresh_backend(name) as backend:
            r = measure(backend, args)
        rows.append([r["backend"], r["clients"], r["messages"], r["rate"], r["lines"],
                     f"{r['complete']}/{r['clients']}", r["events"],
                     r["lag_p50"] * 1000, r["lag_p99"] * 1000, r["lag_max"] * 1000,
                     r["health_p99"] * 1000, r["health_probes"]])
    benchlib.print_table(
        "SSE clients while messages flow",
        ["backend", "clients", "messages", "msg/s", "history lines",
         "clients with every line", "events received", "lag p50 ms", "lag p99 ms",
         "lag max ms", "/health p99 ms", "/health probes"], rows)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average after the run: {load}")


if __name__ == "__main__":
    main()
