"""Peak memory of every process while one large file goes from a file poller to a file
writer (issue 3, Benchmarks: every process below 150 MB).

    python bench/large_file_rss.py --backend postgres --size-mb 200

Starts real worker and beat processes, drops one file of ``--size-mb`` MiB of random
bytes (written outside the scanned tree, then renamed in), samples each process's VmRSS
from /proc every 0.1 s until the writer's file is there and Delivered, and prints each
process's sampled peak and the kernel's own high-water mark (VmHWM). The written file
must be byte-identical (sha256) to the one dropped.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from filebench_lib import (
    PARTNER,
    arguments,
    delivered_count,
    drop_file,
    environment,
    fresh_bench,
    start_processes,
    wait_until,
    written_files,
)

MB = 1 << 20
LIMIT_MB = 150


def _options(parser) -> None:
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)


class RssSampler(threading.Thread):
    """Samples VmRSS of the given processes and their children every ``interval``."""

    def __init__(self, pids: dict[str, int], interval: float = 0.1):
        super().__init__(daemon=True)
        self.pids, self.interval = pids, interval
        self.peak_kb: dict[str, int] = dict.fromkeys(pids, 0)
        self.start_kb = {name: _status_kb(pid, "VmRSS") or 0 for name, pid in pids.items()}
        self.samples = 0
        self._finished = threading.Event()

    def run(self) -> None:
        while not self._finished.wait(self.interval):
            for name, pid in self.pids.items():
                for member in [pid, *_descendants(pid)]:
                    rss = _status_kb(member, "VmRSS")
                    self.peak_kb[name] = max(self.peak_kb[name], rss or 0)
            self.samples += 1

    def stop(self) -> None:
        self._finished.set()
        self.join()


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _descendants(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            for child in map(int, children):
                out += [child, *_descendants(child)]
    except OSError:
        pass
    return out


def random_chunks(size: int, digest) -> object:
    """``size`` random bytes in 1 MiB chunks, each fed to ``digest`` on the way."""
    left = size
    while left:
        chunk = os.urandom(min(MB, left))
        digest.update(chunk)
        left -= len(chunk)
        yield chunk


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main() -> None:
    args = arguments(__doc__.splitlines()[0], _options)
    size = args.size_mb * MB
    with fresh_bench(args.backend, keep=args.keep) as bench:
        procs = start_processes(bench, args.workers)
        before = environment(bench, args.workers)
        sampler = RssSampler({p.name: p.pid for p in procs.procs})
        sampler.start()
        dropped = hashlib.sha256()
        start = time.monotonic()
        drop_file(bench, "large.bin", random_chunks(size, dropped))
        wait_until(lambda: written_files(bench.outbox) >= 1, args.timeout,
                   "the file written", every=0.1)
        done = wait_until(lambda: delivered_count(bench.urls["database_url"]) >= 1, 60,
                          "Delivered", every=0.1)
        sampler.stop()
        high_water = {p.name: _status_kb(p.pid, "VmHWM") or 0 for p in procs.procs}
        same = sha256_of(bench.outbox / "large.bin") == dropped.hexdigest()
        print("\n".join(before))
        print(f"file: {args.size_mb} MiB via {bench.drop_dir().name}/ ({PARTNER}) -> writer, "
              f"{done - start:.1f} s from drop to Delivered; {sampler.samples} samples")
        for name, peak in sampler.peak_kb.items():
            verdict = "ok" if max(peak, high_water[name]) < LIMIT_MB * 1024 else "OVER"
            print(f"{name:8} before {sampler.start_kb[name] / 1024:6.1f} MB   "
                  f"peak VmRSS {peak / 1024:6.1f} MB   "
                  f"VmHWM {high_water[name] / 1024:6.1f} MB   {verdict} (limit {LIMIT_MB} MB)")
        print(f"output byte-identical (sha256): {'yes' if same else 'NO'}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
