"""The destination of ``bench/http_post.py``: a WSGI app (run under gunicorn, one worker
process, threads) that reads each POST's body in chunks, counts its bytes without
keeping them and counts the requests by ``Idempotency-Key``.

    gunicorn --worker-class gthread --workers 1 --threads 8 --chdir bench http_sink:app

``GET /stats``: ``{"requests", "unique", "duplicates", "bytes", "short", "last_at"}``
(``short``: bodies that did not match their Content-Length; ``last_at``: the
``time.monotonic()`` of the last POST, the same clock as the bench's on Linux).
``POST /reset`` zeroes everything. Any other POST is counted and answered 200.
"""

from __future__ import annotations

import json
import threading
import time

_lock = threading.Lock()
_keys: dict[str, int] = {}
_totals = {"requests": 0, "bytes": 0, "short": 0, "last_at": 0.0}


def _stats() -> dict:
    with _lock:
        duplicates = sum(n - 1 for n in _keys.values() if n > 1)
        return {**_totals, "unique": len(_keys), "duplicates": duplicates}


def _answer(start_response, status: str, body: bytes, kind: str = "text/plain"):
    start_response(status, [("Content-Type", kind), ("Content-Length", str(len(body)))])
    return [body]


def app(environ, start_response):
    method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
    if method == "GET" and path == "/stats":
        return _answer(start_response, "200 OK", json.dumps(_stats()).encode(),
                       "application/json")
    if method == "POST" and path == "/reset":
        with _lock:
            _keys.clear()
            _totals.update(requests=0, bytes=0, short=0, last_at=0.0)
        return _answer(start_response, "200 OK", b"reset")
    if method != "POST":
        return _answer(start_response, "405 Method Not Allowed", b"POST only")
    expected = int(environ.get("CONTENT_LENGTH") or 0)
    stream, size = environ["wsgi.input"], 0
    while chunk := stream.read(65536):
        size += len(chunk)
    key = environ.get("HTTP_IDEMPOTENCY_KEY", "")
    with _lock:
        _keys[key] = _keys.get(key, 0) + 1
        _totals["requests"] += 1
        _totals["bytes"] += size
        _totals["short"] += size != expected
        _totals["last_at"] = time.monotonic()
    return _answer(start_response, "200 OK", b"ok")
