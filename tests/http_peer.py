"""A real HTTP destination on loopback for the http_poster tests (``http.server`` in a
thread, TLS optional): it answers each path as the test scripted it and records what
came (method, path, headers, body size, sha256 and the body's first 64 KB), counting a
body's bytes without keeping more of them.

Every peer's URLs start with a path prefix of its own (:func:`own_prefix`), and it counts
only what comes under it. The two backends' suites run side by side, and a worker of
one test may still be retrying to its own peer's port for a moment after that peer
closed; when the kernel gives the freed port to the next peer, in either suite, such a
stray request must not count as what the new test's hub sent. A stray is answered 404
and kept apart (``strays``)."""

from __future__ import annotations

import hashlib
import io
import secrets
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from b2bhub.plugin import DeliveryInfo
from tests.loopback import serve_in_thread

KEEP = 64 * 1024


def own_prefix() -> str:
    """A path prefix no other peer has: what a peer serves is under it alone."""
    return "/peer-" + secrets.token_hex(6)


def own_path(handler: BaseHTTPRequestHandler, prefix: str, strays: list[str]) -> str | None:
    """The request's path below ``prefix``; None, after a 404 and a note in ``strays``,
    when it is not under it (a request meant for a peer that had this port before)."""
    if handler.path.startswith(prefix + "/"):
        return handler.path[len(prefix):]
    strays.append(f"{handler.command} {handler.path}")
    handler.close_connection = True
    handler.send_response(404)
    handler.send_header("Content-Length", "0")
    handler.send_header("Connection", "close")
    handler.end_headers()
    return None


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    size: int
    sha256: str
    body: bytes  # the first KEEP bytes
    client_cert: dict | None = None


@dataclass
class Script:
    """How a path answers: ``status``, ``headers``, ``body``; ``delay`` seconds before
    the answer; ``mode``: ``normal``, ``slow`` (the body in ``pieces`` with ``gap``
    seconds between), ``reset`` (the connection reset instead of an answer)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0
    mode: str = "normal"
    pieces: int = 4
    gap: float = 0.1


class Peer:
    def __init__(self, tls: ssl.SSLContext | None = None):
        self.scripts: dict[str, list[Script]] = {}
        self.seen: list[Seen] = []
        self.prefix, self.strays = own_prefix(), []
        self.lock = threading.Lock()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                peer._handle(self)

            do_GET = do_PUT = do_POST

            def do_HEAD(self):
                peer._handle(self, head=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # a client that timed out and left is part of the tests, not a peer's error
        self.server.handle_error = lambda request, client_address: None
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.port = self.server.server_address[1]
        self.thread = serve_in_thread(self.server)

    def url(self, path: str = "/in") -> str:
        host = "localhost" if self.scheme == "https" else "127.0.0.1"
        return f"{self.scheme}://{host}:{self.port}{self.prefix}{path}"

    def script(self, path: str, *answers: Script) -> None:
        """Answer ``path`` with these in turn, the last one from then on."""
        self.scripts[path] = list(answers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _next(self, path: str) -> Script:
        with self.lock:
            answers = self.scripts.get(path) or [Script()]
            return answers.pop(0) if len(answers) > 1 else answers[0]

    def _handle(self, handler: BaseHTTPRequestHandler, head: bool = False) -> None:
        target = own_path(handler, self.prefix, self.strays)
        if target is None:
            return
        length = int(handler.headers.get("Content-Length") or 0)
        digest, size, kept = hashlib.sha256(), 0, bytearray()
        while size < length:
            chunk = handler.rfile.read(min(1 << 20, length - size))
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            if len(kept) < KEEP:
                kept += chunk[:KEEP - len(kept)]
        cert = None
        if isinstance(handler.connection, ssl.SSLSocket):
            cert = handler.connection.getpeercert()
        path = target.split("?")[0]
        with self.lock:
            self.seen.append(Seen(handler.command, target, dict(handler.headers.items()),
                                  size, digest.hexdigest(), bytes(kept), cert))
        script = self._next(path)
        if script.delay:
            time.sleep(script.delay)
        if script.mode == "reset":
            sock = handler.connection
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.close_connection = True
            sock.close()
            return
        handler.send_response(script.status)
        for name, value in script.headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(script.body)))
        handler.end_headers()
        if head:
            return
        if script.mode == "slow":
            step = max(1, len(script.body) // script.pieces)
            for start in range(0, len(script.body), step):
                handler.wfile.write(script.body[start:start + step])
                handler.wfile.flush()
                time.sleep(script.gap)
        else:
            handler.wfile.write(script.body)


class BytesPayload:
    """A PayloadReader over bytes in memory, for attempts made outside the engine."""

    def __init__(self, body: bytes, stage: str = "unpacked"):
        self.body, self.stage = body, stage

    def stages(self):
        return (self.stage,)

    def size(self, stage):
        return len(self.body)

    def digest(self, stage):
        return hashlib.sha256(self.body).hexdigest()

    def open(self, stage):
        return io.BytesIO(self.body)


class PlainContext:
    """A TargetContext outside the engine: no callback URL, no idempotency key."""

    callback_url = receipt_ref = idempotency_key = None

    def __init__(self):
        self.now = datetime.now(UTC).replace(tzinfo=None)
        self.wire = False

    def wire_started(self):
        self.wire = True

    def log(self, text):
        pass


def direct_attempt(plugin, body: bytes = b"<order/>"):
    """One attempt of ``plugin`` outside the engine; its Outcome."""
    info = DeliveryInfo(delivery_id=1, message_id=1, target=plugin.instance_name, attempt=1,
                        source="inbox", from_party="acme", to_party="mycompany",
                        direction="inbound", original_filename=None, external_id=None,
                        correlation_id=None, sequence_key=None,
                        created_at=datetime.now(UTC).replace(tzinfo=None),
                        payload_stages=("unpacked",))
    return plugin.deliver(info, BytesPayload(body), PlainContext())


def make_tls(directory) -> dict[str, str]:
    """A test CA, a server certificate for localhost/127.0.0.1 and a client certificate
    (CN hub-client), both signed by the CA, written as PEM files; their paths."""
    import ipaddress
    from pathlib import Path

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = Path(directory)
    now = datetime.now(UTC)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def build(cn, key, issuer, issuer_key, ca=False, usage=None, san=None):
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - timedelta(days=1))
                   .not_valid_after(now + timedelta(days=30))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), True))
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write(label, cert, key):
        (directory / f"{label}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (directory / f"{label}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build("b2bhub test CA", ca_key, name("b2bhub test CA"), ca_key, ca=True)
    write("ca", ca, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    write("server", build("localhost", server_key, ca.subject, ca_key,
                          usage=ExtendedKeyUsageOID.SERVER_AUTH,
                          san=[x509.DNSName("localhost"),
                               x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
          server_key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    write("client", build("hub-client", client_key, ca.subject, ca_key,
                          usage=ExtendedKeyUsageOID.CLIENT_AUTH), client_key)
    return {label: str(directory / label) for label in ("ca", "server", "client")}


def tls_server_context(paths: dict[str, str], require_client: bool = True) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths["server"] + ".pem", paths["server"] + ".key")
    if require_client:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(paths["ca"] + ".pem")
    return context
