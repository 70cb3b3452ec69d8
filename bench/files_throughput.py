"""Messages per second from a file poller to a file writer, end to end, with real
worker and beat processes (issue 3, Benchmarks).

    python bench/files_throughput.py --backend postgres --files 10000 --size 2048 --workers 2

``--shards N`` sets the poller's ``scan_shards``: its scan split into N shards, each
under a lease of its own, so that up to N workers pick files up at once (issue 43).

Drops ``--files`` files of ``--size`` bytes (each different) under the poller's
directory as fast as it can, each written outside the scanned tree and renamed in, and
times from the first file dropped to the last file the writer put in place; then waits
until the database has every delivery Delivered, and checks that every message was
Delivered once and every file written holds exactly the bytes dropped (sha256).

Beside it, in the same run, the physical floor (``bench/files_floor.py``): the same
files moved from a directory to another by as many processes, one fsync per batch and
one row inserted and updated per file; measured before and after the hub's run, and the
ratio hub/floor printed against the median of the two (``--no-floor`` leaves it out).
"""

from __future__ import annotations

import hashlib
import os
import statistics
import subprocess
import time
from pathlib import Path

from filebench_lib import (
    CpuMeter,
    Profiler,
    arguments,
    delivered_count,
    drop_file,
    environment,
    fresh_bench,
    start_processes,
    status_counts,
    wait_until,
    write_counts,
    written_files,
)


def _options(parser) -> None:
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--size", type=int, default=2048, help="bytes per file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--writer-concurrency", type=int, metavar="N",
                        help="the writer's Max Concurrent Deliveries (default 16 x "
                             "workers, so that every worker can claim a batch)")
    parser.add_argument("--shards", type=int, default=1, metavar="N",
                        help="the poller's scan_shards (default 1: one worker scans)")
    parser.add_argument("--take-by-link", action="store_true",
                        help="the poller's take_by_link: files go into the payload store "
                             "by a hard link instead of a copy")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record each worker with py-spy into DIR and print the top "
                             "costs")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds to wait for the last file")
    parser.add_argument("--no-floor", action="store_true",
                        help="leave out the physical floor measured before and after")


def body(index: int, size: int) -> bytes:
    """A file's content: unique per index, so the payload store keeps every one."""
    head = f"<order n='{index:08d}'>".encode()
    return (head + b"x" * size)[:size - 1] + b"\n"


def drop_all(bench, files: int, size: int) -> tuple[float, float]:
    """Drop the files; the monotonic times of the first and the last drop."""
    first = time.monotonic()
    for i in range(files):
        drop_file(bench, f"order-{i:06d}.xml", iter([body(i, size)]))
    return first, time.monotonic()


def floor_run(bench, files: int, size: int, workers: int, round_: int) -> float:
    """The physical floor on the same files, database and disk; files per second."""
    from files_floor import run_floor
    inbox, outbox = bench.tmp / f"floor-in-{round_}", bench.tmp / f"floor-out-{round_}"
    inbox.mkdir()
    for i in range(files):
        (inbox / f"order-{i:06d}.xml").write_bytes(body(i, size))
    seconds = run_floor(bench.urls["database_url"], inbox, outbox, workers)
    for i in (0, files - 1):
        if (outbox / f"order-{i:06d}.xml").read_bytes() != body(i, size):
            raise SystemExit("the floor did not copy the bytes dropped")
    subprocess.run(["rm", "-rf", str(inbox), str(outbox)], check=False)
    rate = files / seconds
    print(f"floor round {round_}: {files} files in {seconds:.2f} s: {rate:.1f} files/s",
          flush=True)
    return rate


def main() -> None:
    args = arguments(__doc__.splitlines()[0], _options)
    concurrency = args.writer_concurrency or 16 * args.workers
    floors = []
    with fresh_bench(args.backend, keep=args.keep, writer_concurrency=concurrency,
                     take_by_link=args.take_by_link, scan_shards=args.shards) as bench:
        if not args.no_floor:
            floors.append(floor_run(bench, args.files, args.size, args.workers, 1))
        procs = start_processes(bench, args.workers)
        profiler = Profiler(args.profile, procs)
        before = environment(bench, args.workers)
        meter = CpuMeter(bench)
        meter.start()
        first, dropped = drop_all(bench, args.files, args.size)
        last_report = [time.monotonic()]

        def progress() -> None:
            if time.monotonic() - last_report[0] >= 5:
                last_report[0] = time.monotonic()
                print(f"  {time.monotonic() - first:6.1f} s: "
                      f"{written_files(bench.outbox)} written", flush=True)
        written = wait_until(WrittenAll(bench.outbox, args.files), args.timeout,
                             "all files written", every=0.05, on_wait=progress)
        settled = wait_until(
            lambda: delivered_count(bench.urls["database_url"]) >= args.files,
            120, "every delivery Delivered", every=0.2)
        cpu = meter.stop()
        seconds = written - first
        profile = profiler.stop()
        print("\n".join(before))
        print(f"load average after: {' '.join(f'{x:.2f}' for x in _load())}")
        print(f"files: {args.files} x {args.size} bytes; writer's Max Concurrent "
              f"Deliveries {concurrency}; the poller takes files by "
              f"{'hard link' if args.take_by_link else 'copy'}; its scan in "
              f"{args.shards} shard(s)")
        print(f"dropped in: {dropped - first:.2f} s")
        print(f"first dropped -> last written: {seconds:.2f} s")
        print(f"first dropped -> all Delivered in the database: {settled - first:.2f} s")
        print(f"msgs/s: {args.files / seconds:.1f}")
        print("CPU seconds during the run: " + ", ".join(
            f"{name} {spent:.1f}" for name, spent in sorted(cpu.items()))
            + f" (total {sum(cpu.values()):.1f}; "
              f"{1000 * sum(cpu.values()) / args.files:.2f} ms per message)")
        statuses = status_counts(bench.urls["database_url"])
        print(f"message statuses: {statuses}")
        print("\n".join(profile))
        if not args.no_floor:
            procs.stop_all()  # the floor has the machine to itself, as the hub had
            floors.append(floor_run(bench, args.files, args.size, args.workers, 2))
            floor = statistics.median(floors)
            print(f"floor (median of {len(floors)}, before and after): {floor:.1f} files/s; "
                  f"hub {args.files / seconds:.1f} msgs/s = "
                  f"{100 * args.files / seconds / floor:.0f}% of the floor")
        problems = verify(bench, args.files, args.size, statuses)
        print("verified: every file written once, byte-identical (sha256), every message "
              "Delivered" if not problems else "\n".join(["NOT VERIFIED:", *problems]))
        if problems:
            raise SystemExit(1)


class WrittenAll:
    """True once ``files`` files are written. Listing 10,000 names takes several ms, so
    the directory is listed every 0.25 s until 80 % are there, then at every call: the
    bench's polling takes little of the two cores it measures, and the end is still
    seen within one call."""

    def __init__(self, outbox, files: int):
        self.outbox, self.files = outbox, files
        self.count, self.listed = 0, 0.0

    def __call__(self) -> bool:
        if self.count < 0.8 * self.files and time.monotonic() - self.listed < 0.25:
            return False
        self.count, self.listed = written_files(self.outbox), time.monotonic()
        return self.count >= self.files


def verify(bench, files: int, size: int, statuses: dict[str, int]) -> list[str]:
    """What is wrong with the run's output: a message too many or not Delivered, a file
    missing, extra, or not holding exactly the bytes dropped."""
    problems = []
    if statuses != {"delivered": files}:
        problems.append(f"messages: {statuses}, expected {files} delivered")
    writes = write_counts(bench.urls["database_url"])
    if set(writes.values()) != {files}:
        problems.append(f"written twice or not at all: {writes}, expected {files} of each")
    written = {e.name for e in os.scandir(bench.outbox) if not e.name.startswith(".")}
    expected = {f"order-{i:06d}.xml": i for i in range(files)}
    problems += [f"extra file {name}" for name in sorted(written - set(expected))][:10]
    for name, i in expected.items():
        path = bench.outbox / name
        if name not in written:
            problems.append(f"{name} missing")
        elif hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(
                body(i, size)).digest():
            problems.append(f"{name} does not hold the bytes dropped")
    return problems


def _load() -> tuple[float, float, float]:
    return os.getloadavg()


if __name__ == "__main__":
    main()
