"""A small S3 server of our own on loopback for the tests of how the S3 store's requests
are made: objects in a dict, and every request's SigV4 signature checked by this module's
own reading of AWS's specification (not botocore's signer, so a request signed wrong by
it is refused here), answers scripted ahead (a 503, a SlowDown) and the requests seen,
with the client's port (which TCP connection carried each one).

Only PUT and GET of an object under ``/<bucket>/<key>`` (path style), as the store's
direct requests make them.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from tests.http_peer import own_path
from tests.loopback import serve_in_thread

ALGORITHM = "AWS4-HMAC-SHA256"


@dataclass
class Seen:
    """A request as it arrived."""

    method: str
    path: str
    port: int
    headers: dict[str, str]
    verified: bool
    #: why the signature was refused (None when verified)
    problem: str | None = None


@dataclass
class S3Peer:
    """The server's state: its keys ({access key: secret}), objects, what to answer next."""

    keys: dict[str, str]
    region: str = "us-east-1"
    #: the one bucket the test's store addresses; a request for any other path is a
    #: stray, kept apart in ``strays`` as the HTTP peers keep theirs (``own_path`` of
    #: tests.http_peer: a client of another test still pointed at this port can land here)
    bucket: str | None = None
    objects: dict[str, bytes] = field(default_factory=dict)
    #: (status, S3 error code) to answer, in order, before serving anything
    script: list[tuple[int, str]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()
        peer = self

        class Handler(_Handler):
            state = peer

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = serve_in_thread(self._server)
        host, port = self._server.server_address[:2]
        self.endpoint_url = f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def next_scripted(self) -> tuple[int, str] | None:
        with self._lock:
            return self.script.pop(0) if self.script else None


def signature_problem(method: str, path: str, headers: dict[str, str], body: bytes,
                      keys: dict[str, str], region: str) -> str | None:
    """Why the request's SigV4 signature (Authorization header) is wrong, or None when it
    is right: recomputed from the request as it arrived, with the secret of the access key
    it names."""
    lower = {name.lower(): value for name, value in headers.items()}
    auth = lower.get("authorization", "")
    if not auth.startswith(ALGORITHM + " "):
        return "no SigV4 Authorization header"
    fields = dict(part.strip().split("=", 1) for part in auth[len(ALGORITHM) + 1:].split(","))
    access_key, day, scope_region, service, terminator = fields["Credential"].split("/")
    if access_key not in keys:
        return "InvalidAccessKeyId"
    if (scope_region, service, terminator) != (region, "s3", "aws4_request"):
        return f"wrong scope {fields['Credential']}"
    stamp = lower.get("x-amz-date", "")
    when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    if abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) > 900 \
            or stamp[:8] != day:
        return "RequestTimeTooSkewed"
    signed = fields["SignedHeaders"].split(";")
    if not {"host", "x-amz-date", "x-amz-content-sha256"} <= set(signed):
        return f"headers not signed: {signed}"
    payload = lower["x-amz-content-sha256"]
    if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
        return "XAmzContentSHA256Mismatch"
    parts = urlsplit(path)
    query = "&".join(sorted(parts.query.split("&"))) if parts.query else ""
    canonical = "\n".join([
        method, parts.path, query,
        "".join(f"{name}:{' '.join(lower[name].split())}\n" for name in signed),
        ";".join(signed), payload])
    to_sign = "\n".join([ALGORITHM, stamp, f"{day}/{region}/s3/aws4_request",
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + keys[access_key]).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, fields["Signature"]):
        return "SignatureDoesNotMatch"
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # connections kept open, as S3's are
    state: S3Peer

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: bytes = b"", code: str = "") -> None:
        if code:
            body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                    f"<Message>{code} from the test server</Message>"
                    f"<RequestId>test-request</RequestId></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amz-request-id", "test-request")
        if status == 200 and self.command == "PUT":
            self.send_header("ETag", f'"{hashlib.md5(body).hexdigest()}"')
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _serve(self) -> None:
        bucket = self.state.bucket
        if bucket is not None and own_path(self, f"/{bucket}", self.state.strays) is None:
            return  # a stray: answered 404, its connection closed (tests.http_peer)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = dict(self.headers.items())
        problem = signature_problem(self.command, self.path, headers, body,
                                    self.state.keys, self.state.region)
        self.state.seen.append(Seen(self.command, self.path, self.client_address[1], headers,
                                    problem is None, problem))
        if problem is not None:
            code = problem if " " not in problem else "AccessDenied"
            return self._answer(403, code=code)
        scripted = self.state.next_scripted()
        if scripted is not None:
            return self._answer(scripted[0], code=scripted[1])
        key = unquote(urlsplit(self.path).path)
        if self.command == "PUT":
            self.state.objects[key] = body
            return self._answer(200)
        if key not in self.state.objects:
            return self._answer(404, code="NoSuchKey")
        return self._answer(200, self.state.objects[key])

    do_PUT = do_GET = do_HEAD = _serve
