"""The hub's own work for one async intake, done bare: the third server of
``bench/http_intake.py``, between its floor (one file, one row) and the hub.

Per request, what the hub's ``POST /in/inbox`` must do and nothing of how it is built:

* the receiver's lookups, in the hub's own statement (token, instance, parties, the
  settings a message needs; the core's ``EndpointLookup`` as the receiver declares it,
  ``plugins.http_receiver.LOOKUP``), one round trip;
* the body written to a temporary file of the payload store, its sha256 taken, fsynced
  and renamed into its place by digest;
* the message, its payload row, its queued delivery and its two history lines
  (received, queued) in the hub's own one statement (``b2bhub.engine.dispatch_rows``),
  autocommitted, one round trip;
* a wake-up of the size of the hub's (977 bytes: Celery's message for
  ``b2bhub.deliver``) pushed onto a Redis list;
* the 202 with the message id and its ``Location``.

Each gunicorn thread keeps its own psycopg connection, as the floor does. What it
leaves out is exactly the hub's layers: werkzeug's request and response, the
application context, SQLAlchemy's session and pool, the engine's dispatch (routes,
delivery settings, the new message's rows made from a ``NewMessage``), the group
commit, the payload store's classes and Celery's message made per wake-up. The
figures of the three servers side by side say how much of the hub's cost is the work
the SPEC asks of an intake and how much its layers.

``B2BHUB_DATABASE_URL`` (a psycopg URL), ``B2BHUB_PAYLOAD_DIR`` and
``B2BHUB_BROKER_URL`` (Redis) come from the environment; the instance ``inbox`` routes
to the target ``poster`` (as ``bench/http_intake.py`` configures the hub).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from datetime import datetime, timedelta

import psycopg
import redis
from http_intake_floor import write_synced
from psycopg.rows import namedtuple_row
from sqlalchemy.dialects.postgresql import psycopg as postgresql_psycopg

from b2bhub.engine.dispatch_rows import _statement
from b2bhub.engine.driver import _literals
from b2bhub.engine.history import packed_line
from plugins.http_receiver import LOOKUP

URL = os.environ["B2BHUB_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
STORE = os.environ["B2BHUB_PAYLOAD_DIR"]
TEMP = os.path.join(STORE, "tmp-bare")
os.makedirs(TEMP, exist_ok=True)
_COMPILED = LOOKUP.statement(look_up_instance=True).compile(dialect=postgresql_psycopg.dialect())
LOOKUPS, LOOKUP_VALUES = str(_COMPILED), _literals(_COMPILED)
MESSAGE_COLUMNS = ("source", "from_party", "to_party", "direction", "original_filename",
                   "external_id", "correlation_id", "status", "status_text", "sequence_key",
                   "sha256", "size", "trace_parent")
INSERT = _statement(MESSAGE_COLUMNS).pyformat
WAKEUP = "w" * 977
BROKER = redis.Redis.from_url(os.environ["B2BHUB_BROKER_URL"])
_local = threading.local()


def _connection() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(URL, autocommit=True)
    return conn


def _json(rows: list[dict]) -> str:
    return json.dumps(rows, separators=(",", ":"))


def _answer(start_response, status: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(body)))])
    return [body]


def app(environ, start_response):
    token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")[2].strip()
    conn = _connection()
    with conn.cursor(row_factory=namedtuple_row) as cur:
        cur.execute(LOOKUPS, {**LOOKUP_VALUES, "instance": "inbox", "party_0": None,
                              "party_1": None,
                              "token": hashlib.sha256(token.encode()).hexdigest()})
        found = cur.fetchone()
    if found.x0 is None or not found.enabled:  # x0: the token's row
        return _answer(start_response, "401 Unauthorized", b'{"error": "token"}\n')
    if not (found.kind_0 and found.kind_1):
        return _answer(start_response, "422 Unprocessable Entity", b'{"error": "party"}\n')
    body = environ["wsgi.input"].read()
    digest = hashlib.sha256(body).hexdigest()
    temp = os.path.join(TEMP, uuid.uuid4().hex)
    write_synced(temp, body)
    shard = os.path.join(STORE, digest[:2])
    os.makedirs(shard, exist_ok=True)
    os.replace(temp, os.path.join(shard, digest))
    now = datetime.utcnow()
    from_party, to_party = found.party_0, found.party_1
    pair = f"{from_party}>{to_party}"
    messages = [{"source": "bare", "from_party": from_party,
                 "to_party": to_party, "direction": "inbound",
                 "original_filename": None, "external_id": None, "correlation_id": None,
                 "status": "received", "status_text": "", "sequence_key": pair,
                 "sha256": digest, "size": len(body), "trace_parent": None}]
    payloads = [{"message_id": 1, "stage": "unpacked", "digest": digest, "size": len(body)}]
    deliveries = [{"message_id": 1, "target": "poster", "state": "queued", "attempt": 0,
                   "failures": 0, "wake_count": 1, "last_result": "", "sequence_key": pair}]
    lines = [{"message_id": 1, "type": "received", "actor": "inbox",
              "text": f"received {len(body)} bytes", "delivery_target": None,
              "data": {"size": len(body), "sha256": digest}},
             {"message_id": 1, "type": "delivery_changed", "actor": "inbox",
              "text": "poster: queued", "delivery_target": "poster",
              "data": {"state": "queued"}}]
    packed = [{**packed_line(line), "delivery_target": line["delivery_target"]}
              for line in lines]
    with conn.cursor() as cur:
        cur.execute(INSERT, {"messages": _json(messages), "payloads": _json(payloads),
                             "deliveries": _json(deliveries), "lines": _json(packed),
                             "now": now, "rewake": now + timedelta(seconds=30)})
        message_id, _delivery_id, _target = cur.fetchone()
    BROKER.lpush("bench-bare-wakeups", WAKEUP)
    return _answer(start_response, "202 Accepted", json.dumps(
        {"message_id": message_id, "outcome": "received",
         "location": f"/api/v1/messages/{message_id}"}).encode() + b"\n")
