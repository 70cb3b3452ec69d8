"""Files end to end with the S3 payload store beside the filesystem store, in one run
(issue 21, Benchmark): messages/s and CPU per message for small files, and one large
file through with every process's peak RSS.

    python bench/payload_backends.py --backend postgres --files 2000 --size 2048 --large-mb 1024

For each store (``file``: the payload directory; ``s3``: ``s3://bench/payloads`` on
moto's S3-compatible server, started here on loopback under gunicorn's threaded worker,
which keeps connections alive as S3 does, on the same cores as the hub) a fresh
database, a file_poller -> file_writer route, ``--workers`` workers and beat: drops
``--files`` files of ``--size`` bytes and times the first drop to the last file
written, with the CPU seconds of the workers, beat (and the PostgreSQL backends) in
that time; then drops one file of ``--large-mb`` MiB, waits for it to be written and
checks its sha256, and prints each process's peak RSS (VmHWM, over its whole life) and
the S3 server's. The S3 server's CPU is printed apart: on a real deploy it is not the
hub's, and here it shares the hub's cores. Every file written is checked to hold
exactly the bytes dropped.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

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
from files_throughput import WrittenAll, drop_all, verify

BENCH = Path(__file__).resolve().parent
BUCKET = "bench"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_DEFAULT_REGION": "us-east-1"}
BLOCK = hashlib.sha256(b"large").digest() * 2048  # 64 KiB


def _options(parser) -> None:
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=2048, help="bytes per small file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--large-mb", type=int, default=1024,
                        help="MiB of the large file (0: none)")
    parser.add_argument("--stores", default="file,s3", help="which stores, in order")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record each worker with py-spy into DIR/<store> during the "
                             "small files and print the top costs")
    parser.add_argument("--timeout", type=float, default=1800.0)


class S3Server:
    """moto's S3 server (:mod:`moto_app`) under gunicorn's threaded worker, which keeps
    connections alive as S3 does, on a free loopback port, in processes of their own
    (one worker process: moto keeps the objects in its memory)."""

    def __init__(self, log: Path):
        from tests.procs import free_port  # importable once filebench_lib set the path

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access_log = log.with_suffix(".access")
        self._log = open(log, "wb")  # noqa: SIM115  (closed in stop())
        self.popen = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "--chdir", str(BENCH),
             "--worker-class", "gthread", "--threads", "16", "--workers", "1",
             "--keep-alive", "60", "--bind", f"127.0.0.1:{self.port}",
             "--log-level", "warning", "--access-logfile", str(log.with_suffix(".access")),
             "moto_app:app"],
            stdout=self._log, stderr=subprocess.STDOUT)
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
        wait_until(lambda: self._up(client), 30, "the S3 server up", every=0.2)
        client.create_bucket(Bucket=BUCKET)

    def pids(self) -> list[int]:
        """gunicorn's arbiter and its worker."""
        try:
            with open(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children") as f:
                children = [int(pid) for pid in f.read().split()]
        except OSError:
            children = []
        return [self.popen.pid, *children]

    def requests(self) -> int:
        """Requests answered so far (lines of the access log)."""
        try:
            with open(self.access_log, "rb") as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids())

    def peak_rss_mb(self) -> float:
        return max(peak_rss_mb(pid) for pid in self.pids())

    @staticmethod
    def _up(client) -> bool:
        try:
            client.list_buckets()
        except Exception:
            return False
        return True

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)
        self._log.close()


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a process, in MiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def large_chunks(size: int):
    left = size
    while left > 0:
        piece = BLOCK[:min(left, len(BLOCK))]
        left -= len(piece)
        yield piece


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def run_store(args, store: str, s3: S3Server | None) -> dict:
    extra = {}
    if store == "s3":
        extra = {**CREDENTIALS, "B2BHUB_PAYLOAD_URL": f"s3://{BUCKET}/{store}-{os.getpid()}",
                 "B2BHUB_S3_ENDPOINT_URL": s3.url}
    result: dict = {"store": store}
    with fresh_bench(args.backend, keep=args.keep, writer_concurrency=16 * args.workers
                     ) as bench:
        procs = start_processes(bench, args.workers, extra)
        profiler = Profiler(args.profile / store if args.profile else None, procs)
        result["environment"] = environment(bench, args.workers)
        meter = CpuMeter(bench)
        meter.start()
        server_cpu = s3.cpu_seconds() if s3 is not None else 0.0
        requests = s3.requests() if s3 is not None else 0
        first, _dropped = drop_all(bench, args.files, args.size)
        written = wait_until(WrittenAll(bench.outbox, args.files), args.timeout,
                             "all files written", every=0.05)
        wait_until(lambda: delivered_count(bench.urls["database_url"]) >= args.files,
                   120, "every delivery Delivered", every=0.2)
        cpu = meter.stop()
        result["profile"] = profiler.stop()
        server_cpu = (s3.cpu_seconds() - server_cpu) if s3 is not None else 0.0
        requests = (s3.requests() - requests) if s3 is not None else 0
        seconds = written - first
        result.update(msgs=args.files / seconds, seconds=seconds, cpu=cpu,
                      server_ms=1000 * server_cpu / args.files,
                      requests=requests / args.files,
                      cpu_ms=1000 * sum(cpu.values()) / args.files)
        result["problems"] = verify(bench, args.files, args.size,
                                    status_counts(bench.urls["database_url"]))
        if args.large_mb:
            size = args.large_mb * 1024 * 1024
            start = time.monotonic()
            drop_file(bench, "large.bin", large_chunks(size))
            target = bench.outbox / "large.bin"
            wait_until(lambda: delivered_count(bench.urls["database_url"]) > args.files,
                       args.timeout, "the large file delivered", every=0.5)
            result["large_seconds"] = time.monotonic() - start
            expected = hashlib.sha256()
            for chunk in large_chunks(size):
                expected.update(chunk)
            if file_sha256(target) != expected.hexdigest():
                result["problems"].append("the large file was not written byte-identical")
        result["rss"] = {p.name: peak_rss_mb(p.pid) for p in procs.procs}
        if s3 is not None:
            result["rss"]["S3 server (moto)"] = s3.peak_rss_mb()
    return result


def main() -> None:
    args = arguments(__doc__.splitlines()[0], _options)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    s3 = S3Server(tmp / f"b2bhub-bench-moto-{os.getpid()}.log") if "s3" in stores else None
    results = []
    try:
        for store in stores:
            print(f"--- {store} store", flush=True)
            results.append(run_store(args, store, s3 if store == "s3" else None))
    finally:
        if s3 is not None:
            s3.stop()
    print("\n".join(results[0]["environment"]))
    print(f"small files: {args.files} x {args.size} bytes; large file: {args.large_mb} MiB")
    for r in results:
        print(f"[{r['store']}] msgs/s: {r['msgs']:.1f} ({r['seconds']:.2f} s); CPU per "
              f"message: {r['cpu_ms']:.2f} ms (" + ", ".join(
                  f"{n} {s:.1f} s" for n, s in sorted(r["cpu"].items())) + ")"
              + (f"; the S3 server (moto under gunicorn, on the same cores) besides: "
                 f"{r['server_ms']:.2f} ms, {r['requests']:.2f} requests per message"
                 if r["server_ms"] else ""))
        if args.large_mb:
            print(f"[{r['store']}] large file through in {r['large_seconds']:.1f} s; "
                  "peak RSS (VmHWM): " + ", ".join(
                      f"{n} {mb:.0f} MiB" for n, mb in sorted(r["rss"].items())))
        if r["profile"]:
            print("\n".join(r["profile"]))
        print(f"[{r['store']}] " + ("; ".join(r["problems"]) if r["problems"] else
                                    "verified: every file written once, byte-identical"))
    if len(results) == 2:
        print(f"s3 / file msgs/s: {100 * results[1]['msgs'] / results[0]['msgs']:.0f}% "
              "(goal: at least 50%)")
    if any(r["problems"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
