"""HTTP intake (``http_receiver``): async intake of 2 KB bodies on PostgreSQL + Redis by 4
concurrent clients against gunicorn, beside a floor in the same run, and sync mode's
latency over the destination's own.

    python bench/http_intake.py [--count 1000] [--rounds 5] [--clients 4]

"hub": ``POST /in/inbox`` (bearer token, body streamed into the payload store, message,
delivery and history committed, 202). "floor": a bare WSGI app under the same gunicorn
settings (``bench/http_intake_floor.py``) that writes the body to a file, fsyncs and
inserts a row. "bare": the hub's own work for the same request without its layers
(``bench/http_intake_bare.py``: the hub's lookups and its one INSERT of message,
payload row, delivery and history lines run by psycopg directly, the body fsynced into
the store's layout, a wake-up of the hub's size pushed to Redis); it tells the work an
intake must do from the cost of how the hub is built. The three are up for the whole
run and take turns, ``--rounds`` rounds (default 5) of ``--count`` requests each
(default 1,000), the order rotated each round; each round's ratios are printed, then
the medians of the rounds (requests/s over each run, p50/p99 per request).

Sync: ``POST /in/direct`` delivered through an
``http_poster`` to a loopback destination inside the request, its p50 minus the p50 of
posting the same body to the destination directly, and the web workers' CPU (user +
system, from ``/proc``) per sync request.

The clients post over keep-alive connections with a lean client of a few socket calls
(:class:`Poster`): ``requests`` spent 0.8 ms of CPU per request on the same two cores as
the servers, which slowed the floor more than the hub (the floor waits on its client
more) and so lifted the ratio; ``--requests-client`` measures that way again. Each
run's rows give the CPU per request of the web workers, PostgreSQL, Redis and the
clients. After the rounds, the hub's database must hold exactly one message for each
202 it answered, each with the id its answer named.

``--sync-only``: the sync figures alone. ``--py-spy FILE``: py-spy (installed beside this
Python or on PATH) records each web worker during the sync posts, where it holds the GIL,
as collapsed stacks (FILE, FILE.1; the one client's connection stays with one worker);
``--py-spy-async FILE`` the same during the first round's async intake. The async rows
also give the web workers' CPU per request, the hub's beside the floor's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import requests  # noqa: E402
from benchlib import (  # noqa: E402
    by_kind,
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
    from b2bhub.config.extensions import db
    from b2bhub.services import config as svc
    from plugins.http_poster import HttpPoster
    from plugins.http_receiver import HttpReceiver, create_token
    app = make_app(backend)
    with app.app_context():
        registry = app.extensions["b2bhub.plugin.registry"]
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


class Poster:
    """One client's keep-alive connection, posting the same body again and again: the
    request's bytes made once, the answer read by its Content-Length. ``requests``
    spent 0.8 ms of CPU per request here, on the two cores the servers measured use
    too (a fifth of all the CPU a hub request took); this takes a tenth of that, so
    the figures are the servers' and not the load generator's."""

    def __init__(self, url: str, headers: dict[str, str]):
        parts = urlsplit(url)
        self.address = (parts.hostname, parts.port)
        head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}",
                "Content-Type: application/octet-stream", f"Content-Length: {len(BODY)}",
                *(f"{name}: {value}" for name, value in headers.items())]
        self.request = ("\r\n".join(head) + "\r\n\r\n").encode() + BODY
        self.sock = socket.create_connection(self.address, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def post(self, body: bytes) -> tuple[int, bytes]:
        """(status, body) of one POST of ``body`` (the one the request was made with)."""
        assert body is BODY
        self.sock.sendall(self.request)
        while b"\r\n\r\n" not in self.buffer:
            self._receive()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in lines[1:]
                      if line.lower().startswith(b"content-length:"))
        while len(self.buffer) < length:
            self._receive()
        answer, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, answer

    def _receive(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise SystemExit(f"{self.address}: the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


class RequestsPoster:
    """The same with ``requests`` (``--requests-client``: as the figures before a3257a6
    were measured)."""

    def __init__(self, url: str, headers: dict[str, str]):
        self.url, self.headers, self.session = url, headers, requests.Session()

    def post(self, body: bytes) -> tuple[int, bytes]:
        answer = self.session.post(self.url, data=body, headers=self.headers, timeout=30)
        return answer.status_code, answer.content

    def close(self) -> None:
        self.session.close()


def load(url: str, headers: dict, count: int, clients: int, expect: int,
         workers: list[int], heavy: bool = False) -> dict:
    """``count`` posts from ``clients`` threads, each on its own connection; with the
    CPU the web ``workers`` spent per request, and PostgreSQL's, Redis's and the
    clients' own (:func:`by_kind`)."""
    latencies: list[float] = []
    answers: list[bytes] = []  # list.append is atomic
    lock = threading.Lock()

    def client(n: int) -> None:
        poster, mine = (RequestsPoster if heavy else Poster)(url, headers), []
        for _ in range(n):
            start = time.perf_counter()
            status, answer = poster.post(BODY)
            mine.append(time.perf_counter() - start)
            if status != expect:
                raise SystemExit(f"{url}: {status} {answer[:200]!r}")
            answers.append(answer)
        poster.close()
        with lock:
            latencies.extend(mine)

    wait_booted(workers)
    # warm every worker (connections, caches): new connections from several clients at
    # once, so each worker takes some
    with ThreadPoolExecutor(clients) as pool:
        for warm in pool.map(lambda _: requests.post(url, data=BODY, headers=headers,
                                                     timeout=30), range(10 * clients)):
            if warm.status_code != expect:
                raise SystemExit(f"{url}: {warm.status_code} {warm.text[:200]}")
            answers.append(warm.content)
    cpu, others = sum(map(process_cpu, workers)), by_kind()
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, [count // clients] * clients))
    elapsed = time.perf_counter() - started
    cpu = sum(map(process_cpu, workers)) - cpu
    others = {kind: spent - others[kind] for kind, spent in by_kind().items()}
    latencies.sort()
    n = len(latencies)
    return {"rps": n / elapsed, "p50": statistics.median(latencies) * 1000,
            "answers": answers,
            "p99": latencies[int(n * 0.99) - 1] * 1000, "n": n,
            "cpu_ms": cpu * 1000 / n,
            **{f"{kind}_ms": spent * 1000 / n for kind, spent in others.items()}}


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
                        help="rounds of one floor, one hub and one bare run, in turn")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sync-count", type=int, default=200)
    parser.add_argument("--requests-client", action="store_true",
                        help="post with requests (0.8 ms of CPU a request on the "
                             "servers' cores) instead of the lean keep-alive client")
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
            bare = None if args.sync_only else gunicorn(
                {**env, "PYTHONPATH": os.pathsep.join([str(HERE), env["PYTHONPATH"]])},
                "http_intake_bare:app", 18433)
            try:
                rounds = [] if args.sync_only else alternate(args, hub, floor, bare, tokens)
                check_stored(backend, rounds)
                direct, destination, cpu = sync_figures(args, hub, tokens, sink_url)
            finally:
                for proc in (hub, floor, bare):
                    if proc is not None:
                        proc.terminate()
                        proc.wait(30)
    report(rounds, direct, destination, cpu / args.sync_count)


def alternate(args, hub: subprocess.Popen, floor: subprocess.Popen,
              bare: subprocess.Popen, tokens: dict) -> list[tuple[dict, dict, dict]]:
    """``--rounds`` rounds of the floor's run, the hub's and the bare one's, all servers
    up throughout, the order rotated each round: the machine's speed drifts (by a fifth
    within an hour on one machine, the floor's by half within minutes on another), and
    a ratio of runs taken minutes apart measured the drift as much as the code.
    (floor, hub, bare) per round."""
    hub_workers = worker_pids(hub.pid, int(GUNICORN[1]))
    floor_workers = worker_pids(floor.pid, int(GUNICORN[1]))
    bare_workers = worker_pids(bare.pid, int(GUNICORN[1]))

    def floor_run(_number: int) -> dict:
        return load("http://127.0.0.1:18432/", {}, args.count, args.clients, 202,
                    floor_workers, args.requests_client)

    def bare_run(_number: int) -> dict:
        return load("http://127.0.0.1:18433/in/inbox",
                    {"Authorization": f"Bearer {tokens['inbox']}"}, args.count,
                    args.clients, 202, bare_workers, args.requests_client)

    def hub_run(number: int) -> dict:
        spy = start_py_spy(args.py_spy_async if number == 0 else None, hub_workers)
        run = load("http://127.0.0.1:18431/in/inbox",
                   {"Authorization": f"Bearer {tokens['inbox']}"}, args.count,
                   args.clients, 202, hub_workers, args.requests_client)
        stop_py_spy(spy)
        return run

    rounds = []
    order = [("floor", floor_run), ("hub", hub_run), ("bare", bare_run)]
    for number in range(args.rounds):
        shift = number % len(order)
        runs = {which: run(number) for which, run in order[shift:] + order[:shift]}
        rounds.append((runs["floor"], runs["hub"], runs["bare"]))
        floor_rps, hub_rps, bare_rps = (runs[k]["rps"] for k in ("floor", "hub", "bare"))
        print(f"round {number + 1}: floor {floor_rps:.0f} req/s, hub {hub_rps:.0f} req/s: "
              f"{hub_rps / floor_rps:.0%}; bare {bare_rps:.0f} req/s: "
              f"{bare_rps / floor_rps:.0%} of the floor, the hub {hub_rps / bare_rps:.0%} "
              f"of it; load average {os.getloadavg()[0]:.2f}", flush=True)
    return rounds


def check_stored(backend, rounds: list[tuple[dict, dict, dict]]) -> None:
    """Exactly one message for each 202 of the hub's async intake, under the id it
    named (the bare server's messages have a source of their own)."""
    from sqlalchemy import text
    named = [json.loads(answer)["message_id"] for _floor, hub, _bare in rounds
             for answer in hub["answers"]]
    engine = backend.engine()
    with engine.connect() as conn:
        stored = set(conn.execute(text("SELECT id FROM messages WHERE source = 'inbox'"))
                     .scalars())
    engine.dispose()
    if len(set(named)) != len(named) or set(named) != stored:
        raise SystemExit(f"{len(named)} answers named {len(set(named))} messages; "
                         f"{len(stored)} stored")
    print(f"stored: one message for each of the {len(named)} answers, under its id")


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


def report(rounds: list[tuple[dict, dict, dict]], direct: float, destination: float,
           sync_cpu: float) -> None:
    if rounds:
        kinds = ("cpu_ms", "postgres_ms", "redis_ms", "clients_ms")
        print(f"{'':8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'n':>6}   CPU ms per "
              "request: web, PostgreSQL, Redis, clients   (medians of the rounds)")
        for name, index in (("hub", 1), ("bare", 2), ("floor", 0)):
            rows = [pair[index] for pair in rounds]
            median = {key: statistics.median(row[key] for row in rows)
                      for key in ("rps", "p50", "p99", *kinds)}
            print(f"{name:8} {median['rps']:8.0f} {median['p50']:8.2f} {median['p99']:8.2f} "
                  f"{sum(row['n'] for row in rows):6d}   "
                  + "  ".join(f"{median[kind]:.2f}" for kind in kinds))
        for name, (over, under), goal in (
                ("hub / floor", (1, 0), " (goal >= 50%, and >= 400 req/s)"),
                ("bare / floor", (2, 0), ": the work an intake must do, bare"),
                ("hub / bare", (1, 2), ": what the hub's layers leave of it")):
            ratios = sorted(run[over]["rps"] / run[under]["rps"] for run in rounds)
            print(f"{name}: {statistics.median(ratios):.0%}, the median of {len(ratios)} "
                  f"rounds ({ratios[0]:.0%} to {ratios[-1]:.0%}){goal}")
    print(f"sync p50 {direct:.2f} ms, destination alone p50 {destination:.2f} ms: "
          f"over the destination {direct - destination:.2f} ms (goal < 15 ms)")
    print(f"web workers' CPU per sync request: {sync_cpu * 1000:.2f} ms")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
