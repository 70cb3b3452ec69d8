"""Deliveries per second from a file poller to an http_poster posting to a gunicorn sink
on loopback, beside the floor measured in the same run (issue 13, Benchmark).

    python bench/http_post.py --backend postgres --count 10000 --size 2048 --workers 2

The sink (``bench/http_sink.py``, gunicorn, one worker process with 8 threads) counts
the POSTs by ``Idempotency-Key`` and the bytes of their bodies without keeping them.

- **floor**: this process posts the same ``--count`` bodies to the same sink in a plain
  loop over one kept-alive ``requests.Session`` (one request at a time, like one
  worker's attempts), before and after the engine run; its rate is the mean of the two.
- **engine**: ``--workers`` real worker processes and beat; the files are dropped under
  the poller's directory (each written outside it and renamed in) as fast as this
  process can, and the run is timed from the first drop to the last POST the sink
  received. Then every delivery must be Delivered in the database and the sink must
  have counted each message's key exactly once: any duplicate or missing POST fails the
  bench.

CPU per delivery: user + system seconds of the workers, beat and the PostgreSQL backends
of the bench's database during the engine run, divided by the count (the sink's own CPU
is printed apart, for both runs).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import requests
from filebench_lib import (
    CpuMeter,
    Profiler,
    arguments,
    cpu_seconds,
    delivered_count,
    drop_file,
    environment,
    fresh_bench,
    start_processes,
    status_counts,
    wait_until,
)
from files_throughput import body

from tests.procs import BIN, free_port

BENCH = Path(__file__).resolve().parent


def _options(parser) -> None:
    parser.add_argument("--count", type=int, default=10000, help="messages")
    parser.add_argument("--size", type=int, default=2048, help="bytes per message")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record each worker with py-spy into DIR and print the top "
                             "costs")
    parser.add_argument("--timeout", type=float, default=900.0)


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += cpu_seconds(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return total


def sink_stats(url: str) -> dict:
    return requests.get(f"{url}/stats", timeout=10).json()


def floor(url: str, count: int, size: int, sink_pid: int) -> dict[str, float]:
    """Post every body in a loop over one kept-alive session; rate and CPU."""
    requests.post(f"{url}/reset", timeout=10)
    session = requests.Session()
    bodies = [body(i, size) for i in range(count)]
    sink_before, cpu_before, started = tree_cpu(sink_pid), time.process_time(), \
        time.monotonic()
    for i, data in enumerate(bodies):
        answer = session.post(f"{url}/in", data=data, timeout=30, headers={
            "Content-Type": "application/xml", "Idempotency-Key": f"floor-{i}"})
        answer.content  # noqa: B018 (read the answer as the poster does)
        if answer.status_code != 200:
            raise SystemExit(f"floor: the sink answered {answer.status_code}")
    seconds = time.monotonic() - started
    stats = sink_stats(url)
    if stats["unique"] != count or stats["duplicates"]:
        raise SystemExit(f"floor: the sink counted {stats}")
    return {"rate": count / seconds, "seconds": seconds,
            "client_cpu_ms": 1000 * (time.process_time() - cpu_before) / count,
            "sink_cpu_ms": 1000 * (tree_cpu(sink_pid) - sink_before) / count}


def main() -> None:
    args = arguments(__doc__.splitlines()[0], _options)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    target = {"type": "http_poster", "max_concurrent_deliveries": 16 * args.workers,
              "config": {"url": f"{url}/in", "timeout": 30}}
    with fresh_bench(args.backend, keep=args.keep, target=target) as bench:
        procs = start_processes(bench, args.workers)
        sink = procs.start("sink", [str(BIN / "gunicorn"), "--worker-class", "gthread",
                                    "--workers", "1", "--threads", "8", "--bind",
                                    f"127.0.0.1:{port}", "--chdir", str(BENCH),
                                    "http_sink:app"])
        sink.wait_for(lambda: _up(url), 60, "the sink serving")
        before = environment(bench, args.workers)
        first_floor = floor(url, args.count, args.size, sink.pid)
        print(f"floor (before): {first_floor['rate']:.1f} posts/s", flush=True)
        requests.post(f"{url}/reset", timeout=10)

        profiler = Profiler(args.profile, procs)
        meter = CpuMeter(bench)
        meter.start()
        sink_before = tree_cpu(sink.pid)
        first = time.monotonic()
        for i in range(args.count):
            drop_file(bench, f"order-{i:06d}.xml", iter([body(i, args.size)]))
        dropped = time.monotonic()
        last_report = [first]

        def progress() -> None:
            if time.monotonic() - last_report[0] >= 5:
                last_report[0] = time.monotonic()
                print(f"  {time.monotonic() - first:6.1f} s: "
                      f"{sink_stats(url)['requests']} posted", flush=True)
        wait_until(lambda: sink_stats(url)["requests"] >= args.count, args.timeout,
                   "every message posted", every=0.25, on_wait=progress)
        settled = wait_until(
            lambda: delivered_count(bench.urls["database_url"]) >= args.count,
            120, "every delivery Delivered", every=0.2)
        cpu = meter.stop()
        sink_cpu = tree_cpu(sink.pid) - sink_before
        profile = profiler.stop()
        time.sleep(1)  # a duplicate still on its way would show in the counts
        stats = sink_stats(url)
        seconds = stats["last_at"] - first

        second_floor = floor(url, args.count, args.size, sink.pid)
        rate = args.count / seconds
        floor_rate = (first_floor["rate"] + second_floor["rate"]) / 2
        print("\n".join(before))
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"messages: {args.count} x {args.size} bytes, poller -> http_poster -> "
              f"gunicorn sink (1 worker, 8 threads) on loopback")
        print(f"floor: {first_floor['rate']:.1f} and {second_floor['rate']:.1f} posts/s "
              f"(before, after), mean {floor_rate:.1f}; client CPU "
              f"{first_floor['client_cpu_ms']:.2f} ms per post, sink "
              f"{first_floor['sink_cpu_ms']:.2f} ms")
        print(f"dropped in: {dropped - first:.2f} s")
        print(f"first dropped -> last posted: {seconds:.2f} s; all Delivered in the "
              f"database after {settled - first:.2f} s")
        print(f"deliveries/s: {rate:.1f} ({100 * rate / floor_rate:.0f}% of the floor)")
        total = sum(cpu.values())
        print("CPU seconds during the run: " + ", ".join(
            f"{name} {spent:.1f}" for name, spent in sorted(cpu.items()))
            + f" (total {total:.1f}; {1000 * total / args.count:.2f} ms per delivery); "
              f"sink {sink_cpu:.1f} ({1000 * sink_cpu / args.count:.2f} ms per post)")
        print("\n".join(profile))
        statuses = status_counts(bench.urls["database_url"])
        problems = []
        if statuses != {"delivered": args.count}:
            problems.append(f"message statuses {statuses}")
        if (stats["unique"], stats["duplicates"], stats["short"]) != (args.count, 0, 0):
            problems.append(f"the sink counted {stats['unique']} keys, "
                            f"{stats['duplicates']} duplicates, {stats['short']} short "
                            f"bodies for {args.count} messages")
        if stats["bytes"] != args.count * args.size:
            problems.append(f"the sink received {stats['bytes']} bytes")
        print(f"sink: {stats}")
        print("verified: every message posted exactly once (by Idempotency-Key), whole, "
              "and Delivered" if not problems else "\n".join(["NOT VERIFIED:", *problems]))
        if problems:
            raise SystemExit(1)


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/stats", timeout=1).status_code == 200
    except requests.RequestException:
        return False


if __name__ == "__main__":
    sys.exit(main())
