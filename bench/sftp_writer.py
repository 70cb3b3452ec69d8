"""Files per second from a file poller through sftp_writer to a loopback OpenSSH server,
beside the floor measured in the same run (issue 39, Benchmark); then a 1 GB file.

    python bench/sftp_writer.py --backend embedded --count 1000 --size 10240 --workers 2

The server is Debian's sshd started as the tests start it (``tests/sshd_server.py``:
its own host key and configuration, ``sftp-server``, a password login).

- **floor**: this process uploads the same ``--count`` bodies to the same server in a
  plain loop on one kept paramiko connection (``SFTPClient.putfo``: one file at a time,
  written pipelined, then a stat), before and after the engine run; its rate is the mean
  of the two.
- **engine**: ``--workers`` real worker processes and beat; the files are dropped under
  the poller's directory (each written outside it and renamed in) as fast as this process
  can, and the run is timed from the first drop to the last file in place on the server.
  Every delivery must then be Delivered, every file on the server byte-identical and no
  temporary file left, or the bench fails.
- **writer alone** (the goal's figure): the same count again, with the writer stopped
  while the poller stores them all; then it is started and the run is timed from its
  first attempt to its last settlement: the workers do nothing but deliver, as the
  floor does nothing but upload. The end-to-end figure above adds the poller's intake
  and its two-listing wait (about 2 s before the first attempt) to the same work.
- **1 GB**: one file of 1 GiB dropped the same way, timed from the drop to the file in
  place on the server (the poller's intake included), with each worker's peak resident
  memory (VmHWM); and paramiko's own upload of 1 GiB for comparison.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import paramiko
from filebench_lib import (
    arguments,
    delivered_count,
    drop_file,
    environment,
    fresh_bench,
    start_processes,
    status_counts,
    wait_until,
)

from tests.sshd_server import PASSWORD, USER, SshServer

MB = 1024 * 1024


def _options(parser) -> None:
    parser.add_argument("--count", type=int, default=1000, help="files")
    parser.add_argument("--size", type=int, default=10240, help="bytes per file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--writer-concurrency", type=int, default=16, metavar="N",
                        help="the writer's Max Concurrent Deliveries")
    parser.add_argument("--big", type=int, default=1024, help="MiB of the large file "
                        "(0: none)")
    parser.add_argument("--timeout", type=float, default=900.0)


def bodies(count: int, size: int) -> dict[str, bytes]:
    seed = hashlib.shake_256(b"sftp bench").digest(size + count)
    return {f"f{n:05d}.dat": seed[n:n + size - 8] + n.to_bytes(8, "big")
            for n in range(count)}


def floor(server: SshServer, directory: Path, files: dict[str, bytes]) -> float:
    """Files per second paramiko uploads in a plain loop on one kept connection."""
    directory.mkdir(exist_ok=True)
    os.chown(directory, server.user.pw_uid, server.user.pw_gid)
    transport = paramiko.Transport(("127.0.0.1", server.port))
    transport.connect(username=USER, password=PASSWORD)
    sftp = paramiko.SFTPClient.from_transport(transport)
    try:
        started = time.monotonic()
        for name, body in files.items():
            sftp.putfo(io.BytesIO(body), f"{directory}/{name}")
        seconds = time.monotonic() - started
    finally:
        sftp.close()
        transport.close()
    assert len(os.listdir(directory)) == len(files)
    return len(files) / seconds


def floor_big(server: SshServer, directory: Path, size: int) -> float:
    transport = paramiko.Transport(("127.0.0.1", server.port))
    transport.connect(username=USER, password=PASSWORD)
    sftp = paramiko.SFTPClient.from_transport(transport)
    try:
        started = time.monotonic()
        sftp.putfo(Pattern(size), f"{directory}/floor-big.bin", file_size=size)
        return time.monotonic() - started
    finally:
        sftp.close()
        transport.close()
        (directory / "floor-big.bin").unlink(missing_ok=True)


class Pattern(io.RawIOBase):
    """``size`` bytes of a repeated pseudo-random block, read as a stream."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.block = hashlib.shake_256(b"big").digest(MB + 7)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        out = (self.block * (n // len(self.block) + 1))[:n]
        self.left -= n
        return out


def chunks(size: int):
    stream = Pattern(size)
    while chunk := stream.read(MB):
        yield chunk


def peak_rss(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def attempt_span(database_url: str, after_message: int = 0) -> float:
    """Seconds from the first attempt's start to the last delivery's settlement, of the
    messages after ``after_message``."""
    from sqlalchemy import create_engine, text
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            first = conn.scalar(text(
                "SELECT min(created_at) FROM history WHERE type = 'delivery_changed' "
                "AND text LIKE '% attempt 1 started' AND message_id > :m"),
                {"m": after_message})
            last = conn.scalar(text("SELECT max(settled_at) FROM deliveries "
                                    "WHERE message_id > :m"), {"m": after_message})
    finally:
        engine.dispose()
    if isinstance(first, str):  # SQLite
        from datetime import datetime
        first, last = datetime.fromisoformat(first), datetime.fromisoformat(last)
    return (last - first).total_seconds()


def scalar(database_url: str, query: str) -> int:
    from sqlalchemy import create_engine, text
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return conn.scalar(text(query)) or 0
    finally:
        engine.dispose()


def operator_action(bench, action: str) -> None:
    """Stop or start the writer as an operator does (a history line naming "bench")."""
    from b2bhub import create_app
    from b2bhub.config.extensions import db
    from b2bhub.engine import instances
    from b2bhub.models import utcnow

    app = create_app({"DATA_DIR": bench.urls["data_dir"],
                      "SQLALCHEMY_DATABASE_URI": bench.urls["database_url"],
                      "BROKER_URL": bench.urls["broker_url"]})
    with app.app_context():
        getattr(instances, f"{action}_instance")(db.session, "writer", "bench", utcnow())
        db.session.commit()  # a start wakes the due deliveries after it
        db.engine.dispose()


def writer_alone(bench, out: Path, files: dict[str, bytes], timeout: float) -> float:
    """Files per second of the writer delivering ``files`` stored while it was stopped
    (first attempt to last settlement), each checked on the server."""
    url = bench.urls["database_url"]
    before = scalar(url, "SELECT coalesce(max(id), 0) FROM messages")
    operator_action(bench, "stop")
    for name, body in files.items():
        drop_file(bench, f"q-{name}", iter((body,)))
    wait_until(lambda: scalar(url, f"SELECT count(*) FROM deliveries WHERE message_id > "
                                   f"{before}") >= len(files), timeout,
               "every file stored while the writer is stopped")
    operator_action(bench, "start")
    wait_until(lambda: scalar(url, f"SELECT count(*) FROM deliveries WHERE message_id > "
                                   f"{before} AND state = 'delivered'") >= len(files),
               timeout, "every delivery of the writer alone")
    for name, body in files.items():
        assert (out / f"q-{name}").read_bytes() == body, f"q-{name} differs"
    return len(files) / attempt_span(url, before)


def placed(directory: Path) -> int:
    try:
        return sum(1 for name in os.listdir(directory) if not name.startswith(".b2bhub-"))
    except FileNotFoundError:
        return 0


def main() -> int:
    args = arguments(__doc__.splitlines()[0], _options)
    files = bodies(args.count, args.size)
    work = Path(tempfile.mkdtemp(prefix="b2bhub-sftp-bench-"))
    server = SshServer(work)
    out = server.directory("out")
    try:
        before = floor(server, server.root / "floor-before", files)
        target = {"type": "sftp_writer", "config": {
            "host": "127.0.0.1", "port": server.port, "username": USER,
            "password": PASSWORD, "host_key": server.host_key,
            "remote_directory": str(out), "filename_pattern": "{original_filename}"}}
        with fresh_bench(args.backend, args.keep, target=target,
                         writer_concurrency=args.writer_concurrency) as bench:
            procs = start_processes(bench, args.workers)
            started = time.monotonic()
            for name, body in files.items():
                drop_file(bench, name, iter((body,)))
            dropped = time.monotonic() - started
            done = wait_until(lambda: placed(out) >= args.count, args.timeout,
                              "every file on the server")
            seconds = done - started
            wait_until(lambda: delivered_count(bench.urls["database_url"]) >= args.count,
                       60, "every delivery recorded")
            assert status_counts(bench.urls["database_url"]) == {"delivered": args.count}
            attempts_span = attempt_span(bench.urls["database_url"])
            assert sorted(os.listdir(out)) == sorted(files), "a file missing or left over"
            for name, body in files.items():
                assert (out / name).read_bytes() == body, f"{name} differs"
            alone = writer_alone(bench, out, files, args.timeout)
            after = floor(server, server.root / "floor-after", files)
            env = environment(bench, args.workers)

            big_line = []
            if args.big:
                size = args.big * MB
                started = time.monotonic()
                drop_file(bench, "big.bin", chunks(size))
                wait_until(lambda: (out / "big.bin").exists(), args.timeout,
                           "the large file on the server", every=0.2)
                big_seconds = time.monotonic() - started
                assert (out / "big.bin").stat().st_size == size
                peaks = [peak_rss(p.pid) for p in procs.procs if p.name.startswith("worker")]
                paramiko_big = floor_big(server, server.root, size)
                big_line = [
                    f"{args.big} MiB file: {big_seconds:.1f} s from drop to in place on the "
                    f"server (intake included); paramiko alone {paramiko_big:.1f} s",
                    "worker peak RSS (VmHWM): " + ", ".join(f"{p:.1f} MB" for p in peaks)]
        floor_rate = (before + after) / 2
        rate = args.count / seconds
        print("\n".join(env))
        print(f"files: {args.count} of {args.size} bytes, dropped in {dropped:.1f} s")
        print(f"floor (paramiko putfo loop, one connection): {before:.0f} files/s before, "
              f"{after:.0f} after, mean {floor_rate:.0f}")
        print(f"sftp_writer ({args.workers} workers): {rate:.0f} files/s "
              f"({seconds:.1f} s)")
        print(f"end to end (drop to last file on the server): {100 * rate / floor_rate:.0f}%"
              " of the floor")
        print(f"  of which from the first attempt started to the last delivery settled: "
              f"{attempts_span:.1f} s, {args.count / attempts_span:.0f} files/s "
              f"({100 * args.count / attempts_span / floor_rate:.0f}% of the floor; the "
              "intake of the poller runs on the same workers meanwhile)")
        print(f"writer alone ({args.count} stored while it was stopped, first attempt to "
              f"last settlement): {alone:.0f} files/s, {100 * alone / floor_rate:.0f}% of "
              "the floor (goal: 50%)")
        for line in big_line:
            print(line)
        print(f"load average at the end: "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        server.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
