"""No silent loss on the sending side (issue 42, item 4), as one table: every way a
message we send to a partner can go wrong ends in one truthful state, with the reason,
the payload kept, the alert raised, and nothing anywhere saying it was delivered.

OpenAS2's users lost messages this way (#418, #322, #379, #520, #616: a failed send
that vanished, or landed in the "sent" folder). Here the "sent" places are the
delivery's state and history and the message's status: none may say Delivered before a
receipt does (the ``sent`` stage is what went on the wire, kept as evidence, never a
claim of delivery). The partner is pyas2lib in a process of its own
(``tests/as2_partner.py``) with its quirks switched on per case; a TLS failure is our
HTTPS against its plain HTTP, a timeout a listening socket that never answers.

Each case sends one message with a retry policy of two attempts one second apart:
what the first attempt leaves (Retrying for what may pass, Failed for what will not,
Awaiting receipt for an asynchronous MDN), then the end: Failed, with the reason, the
``message_failed`` alert, the unpacked payload still readable."""

# ruff: noqa: F401, F811  (test_as2's fixtures, imported, are the tests' parameters)

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from sqlalchemy import select

from b2bhub.engine.machine.receipts import fail_overdue_receipts
from b2bhub.models import Alert, Delivery, HistoryLine, PluginInstance, utcnow
from b2bhub.services import config as svc
from tests.procs import free_port
from tests.test_as2 import DATA, as2, certs, partner

# (case, partner quirks, profile choices or a URL maker, state after attempt 1, words
#  of the reason)
SYNC = {"sign": True, "encrypt": True, "mdn_mode": "sync", "mdn_signed": True}
CASES = [
    ("tls failure", {}, {"url": lambda p, s: p.replace("http://", "https://") + "/as2"},
     "retrying", "TLS failed"),
    ("connection refused", {}, {"url": lambda p, s: f"http://127.0.0.1:{s['closed']}/as2"},
     "retrying", "connection failed"),
    ("timeout", {}, {"url": lambda p, s: f"http://127.0.0.1:{s['silent']}/as2"},
     "retrying", "timed out"),
    ("http 404", {}, {"url": lambda p, s: p + "/nowhere"}, "failed", "HTTP 404"),
    ("http 503, retries exhausted", {}, {"url": lambda p, s: p + "/busy"}, "retrying",
     "HTTP 503"),
    ("negative mdn", {"mdn_quirk": "negative"}, {}, "failed",
     "negative MDN from the partner: processed/Error: decryption-failed"),
    ("mdn with a bad signature", {"mdn_quirk": "bad_signature"}, {}, "failed",
     "MDN signature failed our verification"),
    ("mdn with a wrong mic", {"mdn_quirk": "wrong_mic"}, {}, "failed", "MIC mismatch"),
    ("async mdn never coming", {"hold_async": True},
     {"mdn_mode": "async", "receipt_timeout": 60}, "awaiting_receipt",
     "no receipt within 1m"),
]


@pytest.fixture(scope="module")
def sockets():
    """A port nothing listens on, and one that accepts connections and never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    yield {"closed": free_port(), "silent": silent.getsockname()[1]}
    silent.close()


def said_delivered(as2, message_id: int) -> list[str]:
    """Every place that would say the message was delivered."""
    as2.session.expire_all()
    found = [f"history: {t}" for (t,) in as2.session.execute(
        select(HistoryLine.text).where(HistoryLine.message_id == message_id))
        if t.endswith(": Delivered") or "→ Delivered" in t]
    message = as2.messages()[-1]
    if message.status == "delivered":
        found.append("message status delivered")
    if as2.delivery(message_id).state == "delivered":
        found.append("delivery state delivered")
    return found


@pytest.mark.parametrize("case, quirks, choices, first, reason", CASES,
                         ids=[c[0] for c in CASES])
def test_a_send_that_goes_wrong_ends_truthfully_and_loses_nothing(
        as2, sockets, case, quirks, choices, first, reason):
    svc.save_instance(as2.session, as2.hub.registry, {
        "name": "as2out", "type": "as2_sender", "enabled": True,
        "config": {"timeout": 1}, "retry_policy": {
            "strategy": "fixed", "base_delay": 1, "max_attempts": 2}},
        existing=as2.session.scalar(select(PluginInstance).where(
            PluginInstance.name == "as2out")))
    as2.session.commit()
    made = {k: (v(as2.partner.url, sockets) if callable(v) else v)
            for k, v in choices.items()}
    as2.choose(**{**SYNC, "url": as2.partner.url + "/as2", **made})
    as2.partner.configure(**quirks)
    try:
        message = as2.outbound()
        start = utcnow()
        as2.drain(clock=lambda: start)
        delivery = as2.delivery(message.id)
        assert delivery.state == first, (delivery.state, delivery.last_result)
        assert said_delivered(as2, message.id) == []
        if first == "retrying":  # the second and last attempt, its backoff over
            later = start + timedelta(seconds=2)
            as2.drain(clock=lambda: later)
        elif first == "awaiting_receipt":  # the receipt timeout passes
            fail_overdue_receipts(as2.session, start + timedelta(seconds=61), 100)
            as2.session.commit()
        delivery = as2.delivery(message.id)
        assert delivery.state == "failed", (delivery.state, delivery.last_result)
        assert reason in delivery.last_result, delivery.last_result
        assert delivery.attempt == (2 if first == "retrying" else 1)
        assert said_delivered(as2, message.id) == []
        assert as2.messages()[-1].status == "error"
        # the payload is kept for a redelivery, and the operator hears of it
        assert as2.stages(message.id)["unpacked"] == DATA
        alerts = as2.session.scalars(select(Alert).where(
            Alert.kind == "message_failed", Alert.subject == f"message:{message.id}",
            Alert.resolved_at.is_(None))).all()
        assert len(alerts) == 1, [a.text for a in alerts]
    finally:
        as2.partner.configure(**{k: False for k in quirks})
