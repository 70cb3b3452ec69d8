"""HTTP intake (``http_receiver``): async intake of 2 KB bodies on PostgreSQL + Redis by 4
concurrent clients against gunicorn, beside a floor in the same run, and sync mode's
latency over the destination's own.

    python bench/http_intake.py [--count 1000] [--rounds 5] [--clients 4]

"hub": ``POST /in/inbox`` (bearer token, body streamed into the payload store, message,
delivery and history committed, 202). "floor": a bare WSGI app under the same gunicorn
settings (``bench/http_intake_floor.py``) that writes the body to a file, fsyncs and
inserts a row. Hub and floor are both up for the whole run and take turns, ``--rounds``
rounds (default 5) of ``--count`` requests each (default 1,000), the order swapped each
round; each round's ratio is printed, then the medians of the rounds (requests/s over
each run, p50/p99 per request). Sync: ``POST /in/direct`` delivered through an
``http_poster`` to a loopback destination inside the request, its p50 minus the p50 of
posting the same body to the destination directly, and the web workers' CPU (user +
system, from ``/proc``) per sync request.

``--sync-only``: the sync figures alone. ``--py-spy FILE``: py-spy (installed beside this
Python or on PATH) records each web worker during the sync posts, where it holds the GIL,
as collapsed stacks (FILE, FILE.1; the one client's connection stays with one worker);
``--py-spy-async FILE`` the same during the first round's async intake. The async rows
also give the web workers' CPU per request, the hub's beside the floor's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import requests  # noqa: E402
from benchlib import (  # noqa: E402
    environment,
    fresh_backend,
    make_app,
    process_cpu,
    start_py_spy,
    stop_py_spy,
    wait_booted,
    wait_serving,
    worker_pids,
)

GUNICORN = ["--workers", "2", "--threads", "8"]
BODY = (b"<order>" + b"x" * 2033 + b"</order>\n")[:2048]


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # the answer's head and body in one write: unbuffered, the body's small second write
    # waits for the client's delayed ACK of the first (Nagle), 40 ms on loopback, which
    # then stood in both the sync figure and the destination's own
    wbufsize = 1 << 16

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def configure(backend, sink_url: str) -> dict[str, str]:
    from b2bhub.extensions import db
    from b2bhub.services import config as svc
    from plugins.http_poster import HttpPoster
    from plugins.http_receiver import HttpReceiver, create_token
    app = make_app(backend)
    with app.app_context():
        registry = app.extensions["b2bhub.registry"]
        registry.register(HttpReceiver)
        registry.register(HttpPoster)
        s = db.session
        svc.create_party(s, "organization", "mycompany")
        svc.create_party(s, "partner", "acme")
        svc.save_instance(s, registry, {"name": "poster", "type": "http_poster",
                                        "config": {"url": sink_url, "timeout": 5}})
        for name, mode in (("inbox", "async"), ("direct", "sync")):
            svc.save_instance(s, registry, {"name": name, "type": "http_receiver",
                                            "config": {"mode": mode, "target": "poster",
                                                       "from_party": "acme",
                                                       "to_party": "mycompany"}})
        svc.create_route(s, registry, "inbox", "*", "*", "poster", actor="bench")
        tokens = {n: create_token(s, n, "bench", "bench") for n in ("inbox", "direct")}
        s.commit()
        app.extensions["sqlalchemy"].engines[None].dispose()
    return tokens


def gunicorn(env: dict, app: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), *GUNICORN,
                             "--bind", f"127.0.0.1:{port}", app], cwd=HERE.parent, env=env,
                            stderr=subprocess.DEVNULL)
    return wait_serving(proc, f"http://127.0.0.1:{port}/", f"gunicorn {app}")


def load(url: str, headers: dict, count: int, clients: int, expect: int,
         workers: list[int]) -> dict:
    """``count`` posts from ``clients`` threads, each on its own connection; with the
    CPU the web ``workers`` spent per request."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        session, mine = requests.Session(), []
        for _ in range(n):
            start = time.perf_counter()
            answer = session.post(url, data=BODY, headers=headers, timeout=30)
            mine.append(time.perf_counter() - start)
            if answer.status_code != expect:
                raise SystemExit(f"{url}: {answer.status_code} {answer.text[:200]}")
        with lock:
            latencies.extend(mine)

    wait_booted(workers)
    # warm every worker (connections, caches): new connections from several clients at
    # once, so each worker takes some
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda _: requests.post(url, data=BODY, headers=headers, timeout=30),
                      range(10 * clients)))
    cpu = sum(map(process_cpu, workers))
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, [count // clients] * clients))
    elapsed = time.perf_counter() - started
    cpu = sum(map(process_cpu, workers)) - cpu
    latencies.sort()
    return {"rps": len(latencies) / elapsed, "p50": statistics.median(latencies) * 1000,
            "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000, "n": len(latencies),
            "cpu_ms": cpu * 1000 / len(latencies)}


def sequential(url: str, headers: dict, count: int) -> float:
    session, times = requests.Session(), []
    for _ in range(count):
        start = time.perf_counter()
        answer = session.post(url, data=BODY, headers=headers, timeout=30)
        times.append(time.perf_counter() - start)
        assert answer.status_code == 200, answer.text
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000,
                        help="requests per run of the hub and of the floor in each round")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of one floor run and one hub run, alternating")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sync-count", type=int, default=200)
    parser.add_argument("--sync-only", action="store_true",
                        help="only the sync figures (no async intake, no floor)")
    parser.add_argument("--py-spy", metavar="FILE", default=None,
                        help="record the web workers during the sync posts with py-spy "
                             "into FILE and FILE.1, collapsed stacks")
    parser.add_argument("--py-spy-async", metavar="FILE", default=None,
                        help="the same during the async intake")
    args = parser.parse_args()
    for name, value in environment(["postgres"]):
        print(f"{name}: {value}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                            capture_output=True, text=True).stdout.strip()
    print(f"code: {commit or '?'}; gunicorn {' '.join(GUNICORN)}; {len(BODY)} B bodies; "
          f"{args.clients} clients")
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    sink.daemon_threads = True
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    sink_url = f"http://127.0.0.1:{sink.server_address[1]}/in"
    with fresh_backend("postgres") as backend:
        tokens = configure(backend, sink_url)
        from sqlalchemy import text
        engine = backend.engine()
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE floor_rows (id bigserial PRIMARY KEY, "
                              "name text NOT NULL, size int NOT NULL, "
                              "created_at timestamptz NOT NULL DEFAULT now())"))
        engine.dispose()
        env = {**backend.env(), "B2BHUB_LOG_LEVEL": "warning"}
        with tempfile.TemporaryDirectory(dir=backend.data_dir) as floor_dir:
            floor_env = {**env, "FLOOR_DATABASE_URL": backend.database_url,
                         "FLOOR_DIR": floor_dir, "PYTHONPATH": str(HERE)}
            hub = gunicorn(env, "wsgi:app", 18431)
            floor = None if args.sync_only else gunicorn(floor_env, "http_intake_floor:app",
                                                         18432)
            try:
                rounds = [] if args.sync_only else alternate(args, hub, floor, tokens)
                direct, destination, cpu = sync_figures(args, hub, tokens, sink_url)
            finally:
                for proc in (hub, floor):
                    if proc is not None:
                        proc.terminate()
                        proc.wait(30)
    report(rounds, direct, destination, cpu / args.sync_count)


def alternate(args, hub: subprocess.Popen, floor: subprocess.Popen, tokens: dict
              ) -> list[tuple[dict, dict]]:
    """``--rounds`` rounds of the floor's run and the hub's, both servers up throughout,
    the order swapped each round: the machine's speed drifts (by a fifth within an hour
    on one machine), and a ratio of runs taken minutes apart measured the drift as much
    as the code. (floor, hub) per round."""
    hub_workers = worker_pids(hub.pid, int(GUNICORN[1]))
    floor_workers = worker_pids(floor.pid, int(GUNICORN[1]))

    def floor_run(_number: int) -> dict:
        return load("http://127.0.0.1:18432/", {}, args.count, args.clients, 202,
                    floor_workers)

    def hub_run(number: int) -> dict:
        spy = start_py_spy(args.py_spy_async if number == 0 else None, hub_workers)
        run = load("http://127.0.0.1:18431/in/inbox",
                   {"Authorization": f"Bearer {tokens['inbox']}"}, args.count,
                   args.clients, 202, hub_workers)
        stop_py_spy(spy)
        return run

    rounds = []
    for number in range(args.rounds):
        order = (("floor", floor_run), ("hub", hub_run))
        runs = {which: run(number) for which, run in (order if number % 2 == 0
                                                      else order[::-1])}
        rounds.append((runs["floor"], runs["hub"]))
        print(f"round {number + 1}: floor {runs['floor']['rps']:.0f} req/s, hub "
              f"{runs['hub']['rps']:.0f} req/s: {runs['hub']['rps'] / runs['floor']['rps']:.0%}"
              f"; load average {os.getloadavg()[0]:.2f}", flush=True)
    return rounds


def sync_figures(args, hub: subprocess.Popen, tokens: dict, sink_url: str
                 ) -> tuple[float, float, float]:
    """Sync mode's p50, the destination's own p50, and the web workers' CPU over the
    sync posts."""
    sync_url = "http://127.0.0.1:18431/in/direct"
    sync_headers = {"Authorization": f"Bearer {tokens['direct']}"}
    wait_booted(worker_pids(hub.pid, int(GUNICORN[1])))
    sequential(sync_url, sync_headers, 20)  # warm: each worker's runner and session
    workers = worker_pids(hub.pid, int(GUNICORN[1]))
    spy = start_py_spy(args.py_spy, workers)
    cpu = sum(map(process_cpu, workers))
    direct = sequential(sync_url, sync_headers, args.sync_count)
    cpu = sum(map(process_cpu, workers)) - cpu
    stop_py_spy(spy)
    destination = sequential(sink_url, {}, args.sync_count)
    return direct, destination, cpu


def report(rounds: list[tuple[dict, dict]], direct: float, destination: float,
           sync_cpu: float) -> None:
    if rounds:
        print(f"{'':8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'n':>6} {'web CPU ms':>11}"
              "   (medians of the rounds)")
        for name, index in (("hub", 1), ("floor", 0)):
            rows = [pair[index] for pair in rounds]
            median = {key: statistics.median(row[key] for row in rows)
                      for key in ("rps", "p50", "p99", "cpu_ms")}
            print(f"{name:8} {median['rps']:8.0f} {median['p50']:8.2f} {median['p99']:8.2f} "
                  f"{sum(row['n'] for row in rows):6d} {median['cpu_ms']:11.2f}")
        ratios = sorted(hub["rps"] / floor["rps"] for floor, hub in rounds)
        print(f"hub / floor: {statistics.median(ratios):.0%}, the median of {len(ratios)} "
              f"rounds ({ratios[0]:.0%} to {ratios[-1]:.0%}) (goal >= 50%, and >= 400 req/s)")
    print(f"sync p50 {direct:.2f} ms, destination alone p50 {destination:.2f} ms: "
          f"over the destination {direct - destination:.2f} ms (goal < 15 ms)")
    print(f"web workers' CPU per sync request: {sync_cpu * 1000:.2f} ms")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
