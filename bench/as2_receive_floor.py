"""The floor of ``bench/as2_receive.py``: the least an AS2 server must do to answer a
signed and encrypted message with a signed synchronous MDN without ever losing what it
acknowledged, as a bare WSGI app under the same gunicorn settings as the hub.

Per request:

* the protocol work done the hub's way (``plugins.as2.lib``: pyas2lib's parse within
  ``lib.parsing()`` and ``lib.mdn_content``), with the organization's key and the
  partner's certificate loaded once per process and kept (``lib.HubOrganization``,
  ``lib.LoadedPartner``), as the hub keeps them;
* the message as received (headers and body), the document it carries and the MDN
  written to temporary files, renamed into a directory of their own by their sha256,
  and made durable by one ``syncfs`` of that file system (each file fsynced where the
  system has none): the three stages the hub keeps, its one sync;
* one row (Message-ID, sender, the three digests) inserted and committed, PostgreSQL in
  autocommit (one round trip) or SQLite (WAL, ``synchronous=NORMAL`` as the hub's), the
  Message-ID unique: a partner's retry of an acknowledged message stores nothing twice;
* the 200 with the MDN's headers and body.

What it leaves out is what the hub is built of beyond that: Flask and its request, the
profiles' and instance's lookups, routing and the delivery with its history lines, the
payload store's classes, the wake-up. The hub's latency over this floor's is its own
work; this floor's over the protocol work alone ("hub-way") is what storing durably and
answering over HTTP cost any server.

``AS2_FLOOR_CONFIG``: a JSON file with ``key`` (the organization's key and certificate,
PEM) and ``partner_cert`` (PEM); ``B2BHUB_DATABASE_URL`` and ``B2BHUB_DATA_DIR`` come
from the bench's backend.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import uuid

from pyas2lib import Message, Organization

from b2bhub.payloads.store import syncfs
from plugins.as2 import lib

CONFIG = json.loads(open(os.environ["AS2_FLOOR_CONFIG"], encoding="utf-8").read())
URL = os.environ["B2BHUB_DATABASE_URL"]
DIRECTORY = os.path.join(os.environ["B2BHUB_DATA_DIR"], "as2-floor")
TEMP = os.path.join(DIRECTORY, "tmp")
os.makedirs(TEMP, exist_ok=True)
_KEY = CONFIG["key"].encode()
ORG, PARTNER = lib.HubOrganization(as2_name="HUB", sign_key=_KEY, decrypt_key=None), \
    lib.LoadedPartner(as2_name="ACME", verify_cert=CONFIG["partner_cert"].encode(),
                      validate_certs=False, sign=True, encrypt=True)
ORG.decrypt_key = [Organization.load_key(_KEY, None)]  # loaded once, as the hub's
_local = threading.local()
_TABLE = """CREATE TABLE IF NOT EXISTS as2_floor (
    message_id TEXT PRIMARY KEY, sender TEXT NOT NULL, raw TEXT NOT NULL,
    unpacked TEXT NOT NULL, receipt TEXT NOT NULL)"""


def _connection():
    conn = getattr(_local, "conn", None)
    if conn is None:
        if URL.startswith("sqlite"):
            conn = sqlite3.connect(URL.split("///", 1)[1], timeout=60,
                                   isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        else:
            import psycopg
            conn = psycopg.connect(URL.replace("postgresql+psycopg://", "postgresql://"),
                                   autocommit=True)
        conn.execute(_TABLE)
        _local.conn = conn
    return conn


def _place(data: bytes) -> tuple[str, str]:
    """``data`` in a temporary file of the floor's directory, renamed to its digest;
    (digest, path). Durable only after :func:`_sync`."""
    digest = hashlib.sha256(data).hexdigest()
    temp = os.path.join(TEMP, uuid.uuid4().hex)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    final = os.path.join(DIRECTORY, digest)
    os.replace(temp, final)
    return digest, final


def _sync(paths: list[str]) -> None:
    """The stages durable: one syncfs, else each file and the directory fsynced."""
    fd = os.open(DIRECTORY, os.O_RDONLY)
    try:
        if syncfs(fd):
            return
        for path in paths:
            file_fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(file_fd)
            finally:
                os.close(file_fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def _headers(environ) -> list[tuple[str, str]]:
    headers = [(key[5:].replace("_", "-").title(), value)
               for key, value in environ.items() if key.startswith("HTTP_")]
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            headers.append((key.replace("_", "-").title(), environ[key]))
    return headers


def app(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    raw = "".join(f"{k}: {v}\r\n" for k, v in _headers(environ)).encode() + b"\r\n" + body
    message = Message()
    with lib.parsing():
        status, exc, mdn = message.parse(raw, find_org_cb=lambda _id: ORG,
                                         find_partner_cb=lambda _id: PARTNER)
    if status != "processed":
        text = f"{status}: {exc}".encode()
        start_response("400 Bad Request", [("Content-Type", "text/plain"),
                                           ("Content-Length", str(len(text)))])
        return [text]
    content = lib.mdn_content(mdn)
    headers = [(k, v) for k, v in mdn.headers.items()]
    receipt = "".join(f"{k}: {v}\r\n" for k, v in headers).encode() + b"\r\n" + content
    placed = [_place(raw), _place(message.content), _place(receipt)]
    _sync([path for _digest, path in placed])
    conn = _connection()
    conn.execute("INSERT INTO as2_floor VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
                 .replace("%s", "?" if isinstance(conn, sqlite3.Connection) else "%s"),
                 (message.message_id, "ACME", *(digest for digest, _path in placed)))
    start_response("200 OK", [*headers, ("Content-Length", str(len(content)))])
    return [content]
