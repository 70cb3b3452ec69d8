"""The floor of ``bench/http_intake.py``: a bare WSGI app that does the least an intake
must (the body to a file, fsync, a row inserted and committed), served by gunicorn with
the same settings as the hub. ``FLOOR_DATABASE_URL`` (a psycopg URL) and ``FLOOR_DIR``
come from the environment."""

from __future__ import annotations

import os
import threading
import uuid

import psycopg

_local = threading.local()
URL = os.environ.get("FLOOR_DATABASE_URL", "").replace("postgresql+psycopg://",
                                                       "postgresql://")
DIRECTORY = os.environ.get("FLOOR_DIR", "")


def write_synced(name: str, body: bytes) -> None:
    """A new file holding ``body``, fsynced (also the bare server's, which then renames
    it into the payload store's place)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)


def _conn():
    if getattr(_local, "conn", None) is None:
        _local.conn = psycopg.connect(URL)
    return _local.conn


def app(environ, start_response):
    body = environ["wsgi.input"].read()
    name = os.path.join(DIRECTORY, uuid.uuid4().hex)
    write_synced(name, body)
    conn = _conn()
    with conn.cursor() as cur:
        cur.execute("INSERT INTO floor_rows (name, size) VALUES (%s, %s) RETURNING id",
                    (name, len(body)))
        row_id = cur.fetchone()[0]
    conn.commit()
    out = f'{{"id": {row_id}}}\n'.encode()
    start_response("202 Accepted", [("Content-Type", "application/json"),
                                    ("Content-Length", str(len(out)))])
    return [out]
