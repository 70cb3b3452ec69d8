"""Peak RSS of receiving and of sending one large AS2 message, signed, encrypted and
compressed, on the streaming path (plugins.as2.stream), with the output checked byte
for byte.

    python bench/as2_large.py --mb 1024
    python bench/as2_large.py --mb 1024 --threshold 0      # the same, every size streamed

Receive: a client builds the message on files (ACME's key signs, the hub's certificate
encrypts, zlib compresses; the document is incompressible, so the body is as large as
the document) and posts it from its file with Content-Length to gunicorn (one worker
process, as the hub's web runs); the MDN it gets is verified by pyas2lib (signature,
MIC, disposition). The figure is that worker's ``VmHWM`` (/proc/<pid>/status) before
and after. Send: in a fresh process, a TargetRunner (as a worker runs it) sends the
same document through ``as2_sender`` to a loopback sink, which spools what it gets;
the figure is that process's ``VmHWM``. Byte-identical: the sha256 of the stored
``unpacked`` stage (receive) and of the content the sink's copy decrypts, verifies and
decompresses to (send, read with the partner's key) against the source's.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from email import policy
from email.parser import BytesHeaderParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from as2_receive import configure, peak_rss_mb, start_gunicorn, worker_pid  # noqa: E402
from benchlib import (  # noqa: E402
    environment,
    free_port,
    fresh_backend,
    make_app,
    print_table,
    scalar,
)
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives.serialization import load_pem_private_key  # noqa: E402
from pyas2lib import Mdn, Message, Organization, Partner  # noqa: E402

from plugins.as2 import lib, stream  # noqa: E402
from tests.as2kit import make_pair  # noqa: E402

CHUNK = 1 << 20


def make_document(path: Path, mb: int) -> str:
    """mb MiB that zlib cannot shrink (a random MiB repeated: its window is 32 KiB);
    the sha256."""
    block, digest = os.urandom(CHUNK), hashlib.sha256()
    with open(path, "wb") as out:
        for _ in range(mb):
            out.write(block)
            digest.update(block)
    return digest.hexdigest()


class Sampler:
    """The largest ``VmRSS`` of a process, sampled every 50 ms while the block runs
    (what the message costs while it is worked on; ``VmHWM`` also holds start-up)."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.peak = max(self.peak, int(line.split()[1]) / 1024)
            except OSError:  # the process ended
                return

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()


def file_sha256(chunks) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def setup(backend, certs, sink_url: str, threshold: int | None) -> None:
    """as2_receive's hub set-up, with the partner's profile asking for everything and
    limits that take 1 GB."""
    from b2bhub.config.extensions import db
    from b2bhub.models import PluginInstance
    from b2bhub.services import config as svc
    from plugins.as2 import profiles
    configure(backend, certs, sink_url)
    app = make_app(backend)
    with app.app_context():
        registry = app.extensions["b2bhub.plugin.registry"]
        from plugins.as2.plugin import As2Receiver, As2Sender
        registry.register(As2Receiver)
        registry.register(As2Sender)
        profiles.save_profile(db.session, "partner", "acme", {
            "sign": True, "encrypt": True, "compress": True, "chunked": False,
            "mdn_mode": "none", "content_type": "application/octet-stream"})
        extra = {} if threshold is None else {"stream_threshold": threshold}
        for name, config in (("as2in", {"max_size": 4 << 30, **extra}), ("as2out", extra)):
            row = db.session.query(PluginInstance).filter_by(name=name).one()
            svc.save_instance(db.session, registry, {"config": config}, existing=row)
        db.session.commit()
        app.extensions["sqlalchemy"].engines[None].dispose()


def client_build(certs, document: Path, ws: stream.Workspace):
    """The message ACME sends: built on files, asking for a signed sync MDN; with the
    pyas2lib Message that verifies the MDN (its Message-ID and MIC)."""
    key = (certs["acme"][1] + certs["acme"][0]).encode()
    org = Organization(as2_name="ACME", sign_key=key, decrypt_key=key, domain="acme.bench")
    hub = Partner(as2_name="HUB", verify_cert=certs["hub"][0].encode(),
                  encrypt_cert=certs["hub"][0].encode(), validate_certs=False, sign=True,
                  encrypt=True, compress=True, enc_alg="aes_256_cbc", mdn_mode="SYNC",
                  mdn_digest_alg="sha256")
    with open(document, "rb") as source:
        built = stream.build(
            ws, source, sender=org, receiver=hub, filename="large.bin",
            content_type="application/octet-stream", subject="large", message_id=None,
            disposition_notification_to="edi@acme.bench", key_encryption=None,
            sign_with=(load_pem_private_key(certs["acme"][1].encode(), None),
                       x509.load_pem_x509_certificate(certs["acme"][0].encode())),
            encrypt_for=x509.load_pem_x509_certificate(certs["hub"][0].encode()))
    message = Message(org, hub)
    message.message_id, message.mic, message.digest_alg = built.message_id, built.mic, "sha256"
    return built, message


def post_file(port: int, built) -> tuple[int, dict, bytes, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    start = time.perf_counter()
    try:
        with open(built.body, "rb") as body:
            connection.request("POST", "/as2/as2in", body=body, headers={
                **built.headers, "Content-Length": str(built.body.stat().st_size)})
            answer = connection.getresponse()
            content = answer.read()
    finally:
        connection.close()
    return answer.status, dict(answer.getheaders()), content, time.perf_counter() - start


def stored_unpacked(backend) -> str | None:
    digest = scalar(
        backend, "SELECT p.digest FROM messages m JOIN payloads p ON p.message_id = m.id "
        "AND p.stage = 'unpacked' WHERE m.source = 'as2in'")
    if digest is None:
        return None
    app = make_app(backend)
    with app.app_context():
        with app.extensions["b2bhub.store"].open(digest) as f:  # sha256 checked as read
            found = file_sha256(iter(lambda: f.read(CHUNK), b""))
        app.extensions["sqlalchemy"].engines[None].dispose()
    return found


class SpoolSink(BaseHTTPRequestHandler):
    """Keeps each body posted to it in a file (the headers beside it); answers 200."""

    protocol_version = "HTTP/1.1"
    folder: Path
    got: list[tuple[bytes, Path]] = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        left = int(self.headers.get("Content-Length") or 0)
        path = self.folder / f"sink-{len(self.got)}"
        with open(path, "wb") as out:
            while left:
                chunk = self.rfile.read(min(left, CHUNK))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
        block = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items()).encode()
        self.got.append((block, path))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def sink_content(certs, block: bytes, body: Path, ws: stream.Workspace) -> tuple[str, dict]:
    """What the partner reads in the sink's copy: decrypted with ACME's key, the hub's
    signature verified, decompressed; (sha256 of the content, what it found)."""
    raw = ws.new("received")
    with open(raw, "wb") as out:
        out.write(block + b"\r\n")
        for chunk in stream.file_chunks(body):
            out.write(chunk)
    http = BytesHeaderParser(policy=policy.compat32).parsebytes(block)
    got = stream.receive(
        ws, raw, len(block) + 2, http, Partner(as2_name="HUB", sign=True, encrypt=True),
        decrypt_keys=lambda: [(load_pem_private_key(certs["acme"][1].encode(), None),
                               x509.load_pem_x509_certificate(certs["acme"][0].encode()))],
        verify_certs=lambda: [x509.load_pem_x509_certificate(certs["hub"][0].encode())],
        receipt_alg=None, content_head=lib.content_head)
    if got.status != "processed":
        raise SystemExit(f"the sink's copy did not read: {got.status} {got.exc!r}")
    return file_sha256(got.payload.body_chunks()), {
        "signed": got.signed, "encrypted": got.encrypted, "compressed": got.compressed}


def send_child(document: str) -> None:
    """In a fresh process, as a worker: one as2_sender attempt of the document; prints
    its peak RSS, the delivery's state and result."""
    from b2bhub import create_app
    from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
    from b2bhub.engine.runner import TargetRunner
    from b2bhub.models import Delivery, utcnow
    from b2bhub.runtime.hub import new_session
    app = create_app({"WAKEUP_PUBLISHER": lambda items: None})
    with app.app_context():
        store = app.extensions["b2bhub.store"]
        with open(document, "rb") as f:
            stored = store.put(f)
        with new_session() as session:
            store_and_dispatch(session, NewMessage(
                source="@operator", from_party="mycompany", to_party="acme",
                stages={"unpacked": (stored.digest, stored.size)}, targets=["as2out"],
                original_filename="large.bin"), utcnow())
            session.commit()
        TargetRunner(new_session, app.extensions["b2bhub.plugin.registry"], store, "bench").drain(
            "as2out", budget=1800)
        with new_session() as session:
            state, result = session.query(Delivery.state, Delivery.last_result).filter(
                Delivery.target == "as2out").one()
    print(f"{peak_rss_mb(os.getpid()):.0f}\t{state}\t{result}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--send-child":
        send_child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="embedded", choices=("embedded", "postgres"))
    parser.add_argument("--mb", type=int, default=1024, help="the document's size in MiB")
    parser.add_argument("--threshold", type=int, default=None,
                        help="the instances' stream_threshold (default: the default)")
    args = parser.parse_args()
    for name, value in environment([args.backend]):
        print(f"{name}: {value}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                            capture_output=True, text=True).stdout.strip()
    print(f"code: {HERE.parent} at {commit or '?'}")
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    certs = {"hub": make_pair("hub.bench"), "acme": make_pair("acme.bench")}
    work = Path(tempfile.mkdtemp(prefix="as2-large-"))
    SpoolSink.folder = work
    sink = ThreadingHTTPServer(("127.0.0.1", 0), SpoolSink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    rows, checks = [], []
    try:
        document = work / "document"
        source = make_document(document, args.mb)
        with fresh_backend(args.backend) as backend:
            setup(backend, certs, f"http://127.0.0.1:{sink.server_port}/as2", args.threshold)
            with stream.Workspace(work) as ws:
                start = time.perf_counter()
                built, message = client_build(certs, document, ws)
                build_s = time.perf_counter() - start
                wire = built.body.stat().st_size
                port = free_port()
                server = start_gunicorn(backend, port)
                try:
                    pid = worker_pid(server.pid)
                    idle = peak_rss_mb(pid)
                    with Sampler(pid) as during_receive:
                        status, headers, content, post_s = post_file(port, built)
                    received = peak_rss_mb(pid)
                finally:
                    server.terminate()
                    server.wait(60)
            if status != 200:
                raise SystemExit(f"HTTP {status}: {content[:300]!r}")
            raw = lib.header_block(headers.items()) + b"\r\n" + content
            mdn_status, detail = Mdn().parse(raw, lambda _i, _r: message)
            checks.append((f"received: signed MDN verified by pyas2lib, MIC confirmed "
                           f"({mdn_status} {detail or ''})", mdn_status == "processed"))
            stored = stored_unpacked(backend)
            checks.append(("received: stored unpacked stage sha256 = source's",
                           stored == source))
            start = time.perf_counter()
            child = subprocess.Popen([sys.executable, __file__, "--send-child",
                                      str(document)], env=backend.env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            with Sampler(child.pid) as during_send:
                out, err = child.communicate()
            send_s = time.perf_counter() - start
            if child.returncode != 0:
                raise SystemExit(err[-2000:])
            sent_mb, state, result = out.strip().splitlines()[-1].split("\t", 2)
            [(block, body)] = SpoolSink.got
            with stream.Workspace(work) as ws:
                delivered, layers = sink_content(certs, block, body, ws)
            checks.append((f"sent: delivery {state} ({result[:60]})", state == "delivered"))
            checks.append((f"sent: partner's copy {layers} decrypts, verifies, "
                           "decompresses to the source's sha256", delivered == source))
        rows = [["web (gunicorn worker) receiving", f"{idle:.0f}", f"{received:.0f}",
                 f"{during_receive.peak:.0f}", f"{wire / 2**20:.0f}", f"{post_s:.0f}"],
                ["worker process sending (as2_sender attempt)", "", sent_mb,
                 f"{during_send.peak:.0f}", f"{body.stat().st_size / 2**20:.0f}",
                 f"{send_s:.0f}"]]
    finally:
        sink.shutdown()
        subprocess.run(["rm", "-rf", str(work)])
    print(f"document: {args.mb} MiB, sha256 {source[:16]}...; client build {build_s:.0f} s")
    print_table(f"Peak RSS (VmHWM) with a {args.mb} MiB message, signed + encrypted + "
                "compressed, streamed", ["process", "VmHWM idle MB", "VmHWM after MB",
                                         "VmRSS sampled max MB", "body MiB", "seconds"],
                rows)
    for text, ok in checks:
        print(f"{'ok ' if ok else 'FAILED'} {text}")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not all(ok for _t, ok in checks):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
