"""The web process as several gunicorn worker processes (``B2BHUB_WEB_CONCURRENCY``):
each registers itself on the Processes page, and an event stream served by any of them
carries every history line, whichever worker took the request that wrote it."""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import requests
from httpx_sse import connect_sse
from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.config.environment import PRODUCT
from b2bhub.config.extensions import db
from b2bhub.models import HistoryLine
from b2bhub.services.tokens import create_token
from tests.procs import wait_until

pytestmark = pytest.mark.processes


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_two_web_workers_register_and_every_stream_sees_every_line(procs, hub, session):
    hub.parties()
    hub.instance("sink", "noop", enabled=True)
    token = create_token(session, "web-workers", "operator")
    session.commit()
    web = procs.web(threads=8, workers=2)
    headers = {"Authorization": f"Bearer {token}"}

    def webs() -> list[dict]:
        items = requests.get(f"{web.url}/api/v1/processes", headers=headers,
                             timeout=10).json()["items"]
        return [p for p in items if p["kind"] == "web" and p["state"] == "running"]

    wait_until(lambda: len(webs()) == 2, 30, "both web workers registered")
    assert {_parent(p["pid"]) for p in webs()} == {web.pid}

    streams = 4
    seen: list[list[int]] = [[] for _ in range(streams)]
    opened = threading.Barrier(streams + 1)
    done = threading.Event()

    errors: list[BaseException] = []

    def listen(i: int) -> None:
        try:
            with httpx.Client(base_url=web.url, timeout=httpx.Timeout(5, read=30)) as http, \
                    connect_sse(http, "GET", "/api/v1/events", headers=headers) as source:
                assert source.response.status_code == 200
                opened.wait(10)
                for sse in source.iter_sse():
                    if sse.data:
                        seen[i].append(json.loads(sse.data)["id"])
                    if done.is_set():
                        return
        except Exception as exc:  # the server stopping under a finished stream is fine
            if not done.is_set():
                errors.append(exc)

    listeners = [threading.Thread(target=listen, args=(i,), daemon=True)
                 for i in range(streams)]
    for listener in listeners:
        listener.start()
    opened.wait(30)

    def send(i: int) -> int:
        answer = requests.post(f"{web.url}/api/v1/messages", headers=headers, timeout=30,
                               data={"from": "mycompany", "to": "acme", "target": "sink"},
                               files={"file": (f"m{i}.edi", b"ISA*00*web~")})
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    with ThreadPoolExecutor(8) as pool:
        message_ids = list(pool.map(send, range(24)))
    with Session(db.engine) as s:
        expected = set(s.scalars(select(HistoryLine.id).where(
            HistoryLine.message_id.in_(message_ids))))
    assert len(expected) >= len(message_ids)
    wait_until(lambda: all(expected <= set(ids) for ids in seen), 30,
               "every stream carrying every line")
    done.set()
    assert not errors, errors
    for ids in seen:
        assert len(ids) == len(set(ids)), "a line came twice on one stream"
    assert web.alive()


def _server_lines(url: str, path: str, method: str = "GET") -> list[bytes]:
    """The Server header lines of a request without a body, read off the socket (a
    client library would fold two lines into one)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk, head
            head += chunk
    return [line for line in head.partition(b"\r\n\r\n")[0].split(b"\r\n")
            if line.lower().startswith(b"server:")]


def test_every_answer_names_b2bhub_as_its_server_once(procs):
    web = procs.web()
    for path in ("/api/v1/health", "/ui/login", "/no/such/page"):
        assert _server_lines(web.url, path) == [f"Server: {PRODUCT}".encode()], path
    # an endpoint's answer, made before Flask's request handling (here a 404: no such
    # receiver)
    assert _server_lines(web.url, "/in/nosuch", "POST") == [f"Server: {PRODUCT}".encode()]
    assert PRODUCT.startswith("b2bhub/") and PRODUCT != "b2bhub/0"
