"""Asynchronous MDNs we owe partners: due ``as2_inbound`` rows sent by a worker.

A row is taken by moving its due time a lease ahead in its own commit (so two workers
do not both send it), then posted; 2xx → sent, anything else → tried again after 30 s,
2 min, 10 min, 30 min, then hourly, until ``MAX_ATTEMPTS``; then it is failed with the
reason in the message's history. Retries live in the row, not in memory.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.plugin import PayloadStore, add_line
from plugins.as2 import profiles, tls
from plugins.as2.models import As2Inbound

log = logging.getLogger(__name__)
DELAYS = (30, 120, 600, 1800, 3600)
MAX_ATTEMPTS = 10
LEASE = timedelta(minutes=5)


def send_due_mdns(session: Session, store: PayloadStore, now: datetime, limit: int = 50,
                  timeout: float = 30) -> int:
    ids = list(session.scalars(select(As2Inbound.id).where(
        As2Inbound.mdn_state == "pending", As2Inbound.mdn_due_at <= now)
        .order_by(As2Inbound.mdn_due_at).limit(limit)))
    sent = 0
    for row_id in ids:
        taken = session.execute(update(As2Inbound).where(
            As2Inbound.id == row_id, As2Inbound.mdn_state == "pending",
            As2Inbound.mdn_due_at <= now).values(mdn_due_at=now + LEASE)
            .execution_options(synchronize_session=False)).rowcount
        session.commit()
        if taken:
            sent += _send_one(session, store, session.get(As2Inbound, row_id), now, timeout)
    return sent


def _no_profile(name: str):
    raise LookupError(f"the partner '{name}' has no AS2 profile any more")


def _send_one(session: Session, store: PayloadStore, row: As2Inbound, now: datetime,
              timeout: float) -> int:
    partner = None
    try:
        with store.open(row.mdn_digest) as f:
            _head, _sep, body = f.read().partition(b"\r\n\r\n")
        partner = profiles.by_party(session, row.partner)
        answer = tls.post(partner, row.mdn_url, data=body,
                          headers=dict(row.mdn_headers or {}), timeout=timeout) \
            if partner is not None else _no_profile(row.partner)
        problem = None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"
    except Exception as exc:  # connection, TLS, timeout, a payload gone: all retried
        problem = f"{type(exc).__name__}: {exc}"
        if tls.ssl_error_of(exc) is not None:
            problem = f"TLS failed: {tls.explain(exc, partner)}"
    row.mdn_attempts += 1
    if problem is None:
        row.mdn_state, row.mdn_due_at, row.mdn_last_error = "sent", None, ""
        add_line(session, row.message_id, "mdn_sent", f"MDN sent to {row.mdn_url}", now=now)
    elif row.mdn_attempts >= MAX_ATTEMPTS:
        row.mdn_state, row.mdn_due_at, row.mdn_last_error = "failed", None, problem
        add_line(session, row.message_id, "mdn_failed",
                 f"MDN to {row.mdn_url} failed {row.mdn_attempts} times; last: {problem}",
                 now=now)
    else:
        delay = DELAYS[min(row.mdn_attempts, len(DELAYS)) - 1]
        row.mdn_due_at, row.mdn_last_error = now + timedelta(seconds=delay), problem
        add_line(session, row.message_id, "mdn_retrying",
                 f"MDN to {row.mdn_url} not taken ({problem}); again in {delay} s", now=now)
    session.commit()
    if problem:
        log.info("async MDN %s: %s", row.id, problem)
    return problem is None
