"""Files end to end with the S3 payload store beside the filesystem store, in one run
(issue 21, Benchmark): messages/s and CPU per message for small files, and one large
file through with every process's peak RSS.

    python bench/payload_backends.py --backend postgres --files 2000 --size 2048 --large-mb 1024

For each store (``file``: the payload directory; ``s3``: ``s3://bench/payloads`` on an
S3 API server started here on loopback, on the same cores as the hub: ``--s3-server
s3rver``, the default, a real S3 API server in Node installed with npm into
bench/.s3rver on first use, or ``moto``, moto's Python mock under gunicorn's threaded
worker, the default where node or npm is missing) a fresh database, a file_poller ->
file_writer route, ``--workers`` workers and beat: drops ``--files`` files of
``--size`` bytes and times the first drop to the last file written, with the CPU
seconds of the workers, beat (and the PostgreSQL backends) in that time; then drops one
file of ``--large-mb`` MiB, waits for it to be written and checks its sha256, and
prints each process's peak RSS (VmHWM, over its whole life) and the S3 server's. The S3
server's CPU per message (user + system of its processes, from /proc) and its requests
per message are printed apart: on a real deploy it is not the hub's, and here it shares
the hub's cores. Every file written is checked to hold exactly the bytes dropped.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
S3RVER_VERSION = "3.7.1"
S3RVER_DIR = BENCH / ".s3rver"
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
    parser.add_argument("--s3-server", choices=("moto", "s3rver"),
                        help="the S3 API server on loopback (default: s3rver, installed "
                             "with npm on first use, or moto where node or npm is missing)")
    parser.add_argument("--server-core", type=int, default=None, metavar="N",
                        help="the S3 server on core N alone and the hub (this script and "
                             "what it starts) on the other cores, for both stores: the "
                             "object store as if on a host of its own")
    parser.add_argument("--timeout", type=float, default=1800.0)


class S3Server:
    """An S3 API server on a free loopback port, in processes of its own, with the
    bucket made; ``name`` says which, ``credentials`` what the hub signs with."""

    name = ""
    credentials: dict[str, str] = {}
    popen: subprocess.Popen

    def _wait_up(self) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id=self.credentials["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=self.credentials["AWS_SECRET_ACCESS_KEY"])
        wait_until(lambda: self._up(client), 30, f"the S3 server ({self.name}) up", every=0.2)
        client.create_bucket(Bucket=BUCKET)

    def pids(self) -> list[int]:
        """The server's process and its children."""
        try:
            with open(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children") as f:
                children = [int(pid) for pid in f.read().split()]
        except OSError:
            children = []
        return [self.popen.pid, *children]

    def requests(self) -> int:
        """Requests answered so far."""
        raise NotImplementedError

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids())

    def peak_rss_mb(self) -> float:
        return max(peak_rss_mb(pid) for pid in self.pids())

    def _up(self, client) -> bool:
        if self.popen.poll() is not None:
            raise RuntimeError(f"the S3 server ({self.name}) exited: see {self.log}")
        try:
            client.list_buckets()
        except Exception:
            return False
        return True

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)
        self._log.close()


class MotoServer(S3Server):
    """moto's S3 server (:mod:`moto_app`) under gunicorn's threaded worker, which keeps
    connections alive as S3 does (one worker process: moto keeps the objects in its
    memory). A Python mock: XML and werkzeug in Python on every request."""

    name = "moto under gunicorn"
    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                   "AWS_DEFAULT_REGION": "us-east-1"}

    def __init__(self, log: Path):
        from tests.procs import free_port  # importable once filebench_lib set the path

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.access_log = log.with_suffix(".access")
        self._log = open(log, "wb")  # noqa: SIM115  (closed in stop())
        self.popen = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "--chdir", str(BENCH),
             "--worker-class", "gthread", "--threads", "16", "--workers", "1",
             "--keep-alive", "60", "--bind", f"127.0.0.1:{port}",
             "--log-level", "warning", "--access-logfile", str(self.access_log),
             "moto_app:app"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_up()

    def requests(self) -> int:
        """Lines of the access log."""
        try:
            with open(self.access_log, "rb") as f:
                return sum(1 for _ in f)
        except OSError:
            return 0


#: a response line of s3rver's log (koa-logger's "<status> <time> <length>" at its end)
S3RVER_ANSWER = re.compile(rb" \d{3} [\d.,]+m?s \S+\s*$")


class S3rverServer(S3Server):
    """s3rver (npm), a real S3 API server in Node: one process, the objects in files
    of a temporary directory (removed at the end); it takes only its own access key
    (SigV4 signatures parsed, not checked). Installed into ``bench/.s3rver`` on first
    use (:func:`s3rver_script`)."""

    name = "s3rver"
    credentials = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER",
                   "AWS_DEFAULT_REGION": "us-east-1"}

    def __init__(self, log: Path, script: Path):
        self.log = log
        self.data = Path(tempfile.mkdtemp(prefix="b2bhub-bench-s3rver-"))
        self._log = open(log, "wb")  # noqa: SIM115  (closed in stop())
        # port 0: s3rver prints the port it took, so no other process can take it first;
        # not --silent, as its log has a line per request (the count of requests)
        self.popen = subprocess.Popen(
            ["node", str(script), "--directory", str(self.data), "--address", "127.0.0.1",
             "--port", "0", "--no-vhost-buckets"], stdout=self._log, stderr=subprocess.STDOUT)
        wait_until(lambda: self._port() is not None, 30, "s3rver's port", every=0.1)
        self.url = f"http://127.0.0.1:{self._port()}"
        self._wait_up()

    def _port(self) -> int | None:
        if self.popen.poll() is not None:
            raise RuntimeError(f"s3rver exited: see {self.log}")
        found = re.search(rb"S3rver listening on [\d.]+:(\d+)", self.log.read_bytes())
        return int(found.group(1)) if found else None

    def requests(self) -> int:
        try:
            with open(self.log, "rb") as f:
                return sum(1 for line in f if S3RVER_ANSWER.search(line))
        except OSError:
            return 0

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.data, ignore_errors=True)


def s3rver_script() -> Path | None:
    """s3rver's command-line script, ``npm install``-ed into ``bench/.s3rver`` (ignored
    by git) when it is not there yet; None when node or npm is missing or the install
    failed (why is printed)."""
    script = S3RVER_DIR / "node_modules" / "s3rver" / "bin" / "s3rver.js"
    if shutil.which("node") is None:
        print("node is not installed: no s3rver", flush=True)
        return None
    if script.exists():
        return script
    if shutil.which("npm") is None:
        print("npm is not installed: no s3rver", flush=True)
        return None
    print(f"installing s3rver@{S3RVER_VERSION} into {S3RVER_DIR} (once)", flush=True)
    done = subprocess.run(["npm", "install", "--prefix", str(S3RVER_DIR), "--no-audit",
                           "--no-fund", f"s3rver@{S3RVER_VERSION}"],
                          capture_output=True, text=True)
    if done.returncode != 0 or not script.exists():
        print(f"npm could not install s3rver (exit {done.returncode}): "
              f"{done.stderr.strip()[-2000:]}", flush=True)
        return None
    return script


def start_s3_server(choice: str | None, log_dir: Path) -> S3Server:
    """The S3 server asked for; by default s3rver, or moto when s3rver cannot be had."""
    script = s3rver_script() if choice in (None, "s3rver") else None
    if script is None and choice == "s3rver":
        sys.exit("--s3-server s3rver: s3rver cannot be run here (see above)")
    if script is None:
        if choice is None:
            print("the S3 server: moto (s3rver cannot be run here)", flush=True)
        return MotoServer(log_dir / f"b2bhub-bench-moto-{os.getpid()}.log")
    return S3rverServer(log_dir / f"b2bhub-bench-s3rver-{os.getpid()}.log", script)


def pin_threads(pids: list[int], cores: set[int]) -> None:
    """Every thread of these processes on ``cores`` (an affinity set by pid moves only the
    thread of that id; node's and gunicorn's other threads exist already)."""
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), cores)


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
        extra = {**s3.credentials, "B2BHUB_PAYLOAD_URL": f"s3://{BUCKET}/{store}-{os.getpid()}",
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
            result["rss"][f"S3 server ({s3.name})"] = s3.peak_rss_mb()
    return result


def main() -> None:
    args = arguments(__doc__.splitlines()[0], _options)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    hub_cores = None
    if args.server_core is not None:
        hub_cores = os.sched_getaffinity(0) - {args.server_core}
        if not hub_cores or args.server_core not in os.sched_getaffinity(0):
            sys.exit(f"--server-core {args.server_core}: needs that core and another")
    s3 = start_s3_server(args.s3_server, tmp) if "s3" in stores else None
    if hub_cores is not None:
        os.sched_setaffinity(0, hub_cores)  # what starts from here on inherits it
        if s3 is not None:
            pin_threads(s3.pids(), {args.server_core})
    where = ("on the same cores" if hub_cores is None else
             f"on core {args.server_core} alone, the hub on {sorted(hub_cores)}")
    if s3 is not None:
        print(f"the S3 server: {s3.name} at {s3.url} (log: {s3.log}), {where}", flush=True)
    results = []
    try:
        for store in stores:
            print(f"--- {store} store", flush=True)
            results.append(run_store(args, store, s3 if store == "s3" else None))
    finally:
        if s3 is not None:
            s3.stop()
    print("\n".join(results[0]["environment"]))
    print(f"small files: {args.files} x {args.size} bytes; large file: {args.large_mb} MiB"
          + (f"; S3 server: {s3.name}" if s3 is not None else ""))
    for r in results:
        print(f"[{r['store']}] msgs/s: {r['msgs']:.1f} ({r['seconds']:.2f} s); CPU per "
              f"message: {r['cpu_ms']:.2f} ms (" + ", ".join(
                  f"{n} {s:.1f} s" for n, s in sorted(r["cpu"].items())) + ")"
              + (f"; the S3 server ({s3.name}, {where}) besides: "
                 f"{r['server_ms']:.2f} ms CPU, {r['requests']:.2f} requests per message"
                 if r["store"] == "s3" else ""))
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
