"""A real HTTP destination on loopback for business-rule tests: it records every body it
is sent, in order, and answers each with the first answer whose marker the body
contains (else 200 ``{"status": "OK"}``). Tests change ``answers`` while it runs. Like
every test peer it serves under a path prefix of its own (:mod:`tests.http_peer`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.http_peer import own_path, own_prefix
from tests.loopback import serve_in_thread


@dataclass
class PeerAnswer:
    status: int = 200
    body: bytes = b'{"status": "OK"}'
    content_type: str = "application/json"


@dataclass
class AnsweringPeer:
    answers: dict[bytes, PeerAnswer] = field(default_factory=dict)  # marker -> answer
    received: list[bytes] = field(default_factory=list)
    url: str = ""
    prefix: str = field(default_factory=own_prefix)
    strays: list[str] = field(default_factory=list)

    def answer_for(self, body: bytes) -> PeerAnswer:
        for marker, answer in list(self.answers.items()):
            if marker in body:
                return answer
        return PeerAnswer()


def start_peer() -> tuple[AnsweringPeer, ThreadingHTTPServer]:
    peer = AnsweringPeer()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the http.server name)
            if own_path(self, peer.prefix, peer.strays) is None:
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                peer.received.append(body)
            answer = peer.answer_for(body)
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    peer.url = f"http://127.0.0.1:{server.server_address[1]}{peer.prefix}/orders"
    serve_in_thread(server)
    return peer, server


@contextmanager
def running_peer() -> Iterator[AnsweringPeer]:
    """A peer serving until the block ends."""
    peer, server = start_peer()
    try:
        yield peer
    finally:
        server.shutdown()
        server.server_close()
