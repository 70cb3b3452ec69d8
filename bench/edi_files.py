"""What reading envelopes costs: X12 files from a file poller to a file writer, end to
end, with real worker and beat processes, inspection on against inspection off in the
same run (issue 38, Benchmark).

    python bench/edi_files.py --backend postgres --files 10000 --size 2048 --workers 2

``--files`` generated X12 850 interchanges of about ``--size`` bytes each, each one
valid and different (its control numbers, PO numbers, sender, separators, line breaks,
1-3 transaction sets), are dropped under the poller's directory and timed from the first
file dropped to the last file the writer put in place, as ``bench/files_throughput.py``
times them. Each run has a fresh database and fresh worker processes, started with
``B2BHUB_INSPECTORS`` unset (inspection on: the ``x12`` inspector reads every file's
envelope at intake) or empty (off: no payload is opened for it). ``--rounds`` pairs of
runs, on then off, the order reversed from pair to pair, so a machine whose speed drifts
moves both alike; each pair's ratio on/off is printed, then the median of the ratios
and their range.

Every run is checked: every message Delivered once, every file written byte for byte
(sha256), and, with inspection on, every message with its envelope (``standard X12``,
its sets counted, no envelope error); with it off, no envelope attribute at all.
"""

from __future__ import annotations

import hashlib
import os
import random
import statistics
import sys
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
from sqlalchemy import create_engine, text

GOAL = 0.15  # inspection on costs at most 15% of the throughput with it off

#: (element, sub-element, repetition, segment terminator) as ISA declares them
SEPARATORS = [("*", ">", "U", "~"), ("*", ":", "^", "~"), ("|", "^", "{", "\x1c"),
              ("^", ":", "!", "'")]
NEWLINES = ["\n", "", "\r\n"]
SENDERS = [("ZZ", "ACME"), ("01", "123456789"), ("12", "5551234567"), ("ZZ", "ACME-EAST")]


def interchange(n: int, size: int) -> bytes:
    """The ``n``-th file: a valid X12 interchange of one group of 1-3 850s, PO1 lines
    added until it is about ``size`` bytes; the same ``n`` gives the same bytes."""
    rng = random.Random(n)
    e, sub, rep, t = rng.choice(SEPARATORS)
    newline = rng.choice(NEWLINES)

    def seg(*fields: str) -> str:
        return e.join(fields) + t + newline

    qualifier, sender = rng.choice(SENDERS)
    day = f"2612{1 + n % 28:02d}"
    clock = f"{n % 24:02d}{n % 60:02d}"
    control, group = f"{n + 1:09d}", str(1000 + n)
    head = [seg("ISA", "00", " " * 10, "00", " " * 10, qualifier, sender.ljust(15), "ZZ",
                "MYCOMPANY".ljust(15), day, clock, rep, "00401", control, "0", "P", sub),
            seg("GS", "PO", sender, "MYCOMPANY", "20" + day, clock, group, "X", "004010")]
    sets = []
    for k in range(rng.choice((1, 1, 1, 2, 3))):
        sets.append([seg("BEG", "00", "SA", f"PO-{n}-{k}", "", "20" + day),
                     seg("N1", "ST", f"Warehouse {rng.randint(1, 99)}", "92",
                         f"WH{rng.randint(1, 999):03d}")])
    tail_estimate = len(seg("GE", "3", group)) + len(seg("IEA", "1", control)) + sum(
        len(seg("ST", "850", "0001")) + len(seg("SE", "12", "0001"))
        + len(seg("CTT", "12")) for _ in sets)
    total = sum(map(len, head)) + sum(len(s) for one in sets for s in one) + tail_estimate
    line = 0
    while total < size:
        one = sets[line % len(sets)]
        line += 1
        po1 = seg("PO1", str(line), str(rng.randint(1, 500)), "EA",
                  f"{rng.randint(100, 99999) / 100:.2f}", "", "VP",
                  f"SKU-{rng.randint(1, 99999):05d}", "BP", f"{rng.randint(1, 10**8):08d}")
        one.append(po1)
        total += len(po1)
    out = list(head)
    for k, body in enumerate(sets):
        ctl = f"{k + 1:04d}"
        body.append(seg("CTT", str(len(body) - 2)))
        out += [seg("ST", "850", ctl), *body, seg("SE", str(len(body) + 2), ctl)]
    out += [seg("GE", str(len(sets)), group), seg("IEA", "1", control)]
    return "".join(out).encode("latin-1")


def _options(parser) -> None:
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--size", type=int, default=2048, help="about this many bytes a file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3,
                        help="pairs of runs, inspection on and off, alternated")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record each worker with py-spy into DIR (a directory per run)"
                             " and print the top costs")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds to wait for the last file of a run")


def name(i: int) -> str:
    return f"po-{i:06d}.edi"


def one_run(args, files: list[bytes], inspect: bool, label: str) -> dict:
    """One run on a fresh backend: its messages per second, CPU and load."""
    concurrency = 16 * args.workers
    with fresh_bench(args.backend, keep=args.keep, writer_concurrency=concurrency) as bench:
        procs = start_processes(bench, args.workers,
                                None if inspect else {"B2BHUB_INSPECTORS": ""})
        profiler = Profiler(args.profile / label if args.profile else None, procs)
        before = environment(bench, args.workers)
        meter = CpuMeter(bench)
        meter.start()
        first = time.monotonic()
        for i, body in enumerate(files):
            drop_file(bench, name(i), iter([body]))
        dropped = time.monotonic()
        written = wait_until(lambda: written_files(bench.outbox) >= len(files),
                             args.timeout, "all files written", every=0.05)
        wait_until(lambda: delivered_count(bench.urls["database_url"]) >= len(files), 120,
                   "every delivery Delivered", every=0.2)
        cpu = meter.stop()
        profile = profiler.stop()
        load_after = os.getloadavg()
        problems = verify(bench, files, inspect)
        seconds = written - first
        result = {"label": label, "inspect": inspect, "rate": len(files) / seconds,
                  "seconds": seconds, "dropped": dropped - first, "cpu": cpu,
                  "load_before": before[5].split(": ")[1],
                  "load_after": " ".join(f"{x:.2f}" for x in load_after),
                  "environment": before, "problems": problems, "profile": profile}
    return result


def verify(bench, files: list[bytes], inspect: bool) -> list[str]:
    """What is wrong with a run: a message not Delivered once, a file not written byte
    for byte, an envelope missing (on) or present (off)."""
    problems = []
    url = bench.urls["database_url"]
    statuses = status_counts(url)
    if statuses != {"delivered": len(files)}:
        problems.append(f"messages: {statuses}, expected {len(files)} delivered")
    writes = write_counts(url)
    if set(writes.values()) != {len(files)}:
        problems.append(f"written twice or not at all: {writes}")
    for i, body in enumerate(files):
        path = bench.outbox / name(i)
        if not path.exists():
            problems.append(f"{name(i)} missing")
        elif hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(body).digest():
            problems.append(f"{name(i)} does not hold the bytes dropped")
        if len(problems) > 10:
            break
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = dict(conn.execute(text(
                "SELECT name, count(DISTINCT message_id) FROM message_attributes "
                "WHERE name IN ('standard', 'sets', 'edi_error') GROUP BY name")).all())
            rows = conn.scalar(text("SELECT count(*) FROM message_attributes"))
    finally:
        engine.dispose()
    if inspect and (found.get("standard") != len(files) or found.get("sets") != len(files)
                    or found.get("edi_error")):
        problems.append(f"envelopes: {found}, expected {len(files)} X12 without errors")
    if not inspect and rows:
        problems.append(f"inspection off, yet {rows} envelope attributes")
    return problems


def median_range(values: list[float], fmt: str = "{:.1f}") -> str:
    return (f"{fmt.format(statistics.median(values))} "
            f"({fmt.format(min(values))}-{fmt.format(max(values))})")


def main() -> None:
    args = arguments(__doc__.splitlines()[0], _options)
    started = os.getloadavg()
    files = [interchange(i, args.size) for i in range(args.files)]
    sizes = [len(f) for f in files]
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"files: {len(files)} X12 850 interchanges, {min(sizes)}-{max(sizes)} bytes "
          f"(mean {statistics.mean(sizes):.0f}); writer's Max Concurrent Deliveries "
          f"{16 * args.workers}", flush=True)
    runs = []
    for round_ in range(1, args.rounds + 1):
        order = (True, False) if round_ % 2 else (False, True)
        for inspect in order:
            label = f"round{round_}-{'on' if inspect else 'off'}"
            run = one_run(args, files, inspect, label)
            runs.append(run)
            if round_ == 1 and inspect == order[0]:
                print("\n".join(run["environment"]))
            cpu = run["cpu"]
            print(f"round {round_}, inspection {'on ' if inspect else 'off'}: "
                  f"{run['rate']:7.1f} msgs/s ({run['seconds']:.2f} s, dropped in "
                  f"{run['dropped']:.2f} s); CPU {1000 * sum(cpu.values()) / len(files):.2f}"
                  f" ms a message (" + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(
                      cpu.items())) + f"); load {run['load_before']} -> {run['load_after']}",
                  flush=True)
            for line in run["profile"]:
                print(line)
            if run["problems"]:
                print("\n".join(["NOT VERIFIED:", *run["problems"]]))
                raise SystemExit(1)
    summary(runs, args.files, started)


def summary(runs: list[dict], files: int, started: tuple) -> None:
    on = [r for r in runs if r["inspect"]]
    off = [r for r in runs if not r["inspect"]]
    ratios = [a["rate"] / b["rate"] for a, b in zip(on, off, strict=True)]
    cpu_on = [1000 * sum(r["cpu"].values()) / files for r in on]
    cpu_off = [1000 * sum(r["cpu"].values()) / files for r in off]
    cpu_ratios = [a / b for a, b in zip(cpu_on, cpu_off, strict=True)]
    print(f"inspection on:  {median_range([r['rate'] for r in on])} msgs/s, CPU "
          f"{median_range(cpu_on, '{:.2f}')} ms a message")
    print(f"inspection off: {median_range([r['rate'] for r in off])} msgs/s, CPU "
          f"{median_range(cpu_off, '{:.2f}')} ms a message")
    print("on / off per round: " + ", ".join(f"{100 * r:.1f}%" for r in ratios))
    print(f"on / off: median {100 * statistics.median(ratios):.1f}% "
          f"({100 * min(ratios):.1f}-{100 * max(ratios):.1f}%) of the throughput; "
          f"CPU a message {100 * statistics.median(cpu_ratios):.1f}% "
          f"({100 * min(cpu_ratios):.1f}-{100 * max(cpu_ratios):.1f}%)")
    cost = 1 - statistics.median(ratios)
    print(f"inspection costs {100 * cost:.1f}% of the throughput (median); goal at most "
          f"{100 * GOAL:.0f}%: {'yes' if cost <= GOAL else 'no'}")
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in started)}; at the end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"verified: each run's {files} messages Delivered once, written byte for byte, "
          "with their envelopes when inspection was on and none when off")


if __name__ == "__main__":
    main()
