"""Settlement (SPEC 5, 6): outcomes become states by the target's retry policy;
receipts that never come fail; a stop never fails a delivery."""

from __future__ import annotations

import pytest

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy, merge
from b2bhub.engine.machine import claiming, settlement
from b2bhub.engine.sweep import run_sweep
from b2bhub.services import config as svc
from tests.enginekit import T0, alerts, at, claim_one, delivery, message, standard_hub, texts


def _one_message(hub, session, **target_fields) -> tuple[int, RetryPolicy]:
    """A message to writer_a dispatched at T0, and writer_a's resolved retry policy."""
    standard_hub(hub, **target_fields)
    hub.route("inbox", "*", "*", "writer_a")
    sent = hub.message(now=T0)
    stored = svc.get_instance(session, "writer_a").retry_policy
    return sent.id, merge(stored, RetryPolicy())


def _settle(session, claim, outcome, policy, now) -> None:
    assert settlement.settle(session, claim, outcome, policy, now)
    session.commit()


def test_errors_are_retried_by_the_policy_then_fail(hub, session):
    message_id, policy = _one_message(hub, session, retry_policy={
        "strategy": "exponential", "base_delay": 30, "max_attempts": 3})
    subject = f"message:{message_id}"

    first = claim_one(session, "writer_a", "worker-a", at(0))
    _settle(session, first, Outcome.error("connection", "refused"), policy, at(1))
    row = delivery(session, first.delivery_id)
    assert (row.state, row.due_at, row.failures) == ("retrying", at(31), 1)
    assert message(session, message_id).status == "retrying"
    assert claiming.claim(session, "writer_a", "worker-a", at(30), 1, 300) == []  # not due

    second = claim_one(session, "writer_a", "worker-a", at(31))
    _settle(session, second, Outcome.error("connection", "refused"), policy, at(32))
    row = delivery(session, second.delivery_id)
    assert (row.state, row.due_at, row.failures) == ("retrying", at(92), 2)  # 30 s, 60 s
    assert alerts(session, "message_failed", subject) == []

    third = claim_one(session, "writer_a", "worker-a", at(92))
    _settle(session, third, Outcome.error("connection", "refused"), policy, at(93))
    row = delivery(session, third.delivery_id)
    assert (row.state, row.failure_kind, row.attempt) == ("failed", "technical", 3)
    assert message(session, message_id).status == "error"
    assert "writer_a: attempt 3 failed: refused (attempts used up (3))" in texts(
        session, message_id)
    [alert] = alerts(session, "message_failed", subject)
    assert alert.resolved_at is None


def test_a_fail_rule_fails_at_once(hub, session):
    message_id, policy = _one_message(hub, session, retry_policy={
        "max_attempts": 5, "rules": [{"match": "http_404", "action": "fail"}]})

    won = claim_one(session, "writer_a", "worker-a", at(0))
    _settle(session, won, Outcome.error("http_404", "404 Not Found"), policy, at(1))

    row = delivery(session, won.delivery_id)
    assert (row.state, row.failure_kind, row.attempt) == ("failed", "technical", 1)
    assert "writer_a: attempt 1 failed: 404 Not Found (error class http_404 is not " \
           "retried)" in texts(session, message_id)
    assert message(session, message_id).status == "error"
    assert len(alerts(session, "message_failed", f"message:{message_id}")) == 1


def test_other_errors_are_still_retried_beside_a_fail_rule(hub, session):
    message_id, policy = _one_message(hub, session, retry_policy={
        "max_attempts": 5, "rules": [{"match": "http_404", "action": "fail"}]})
    won = claim_one(session, "writer_a", "worker-a", at(0))
    _settle(session, won, Outcome.error("http_503", "503 Unavailable"), policy, at(1))
    assert delivery(session, won.delivery_id).state == "retrying"


def test_a_business_error_fails_with_failure_kind_business(hub, session):
    message_id, policy = _one_message(hub, session)

    won = claim_one(session, "writer_a", "worker-a", at(0))
    _settle(session, won, Outcome.business_error("unknown_po", "PO 4711 unknown"), policy,
            at(1))

    row = delivery(session, won.delivery_id)
    assert (row.state, row.failure_kind) == ("failed", "business")
    assert message(session, message_id).status == "business_error"
    assert "writer_a: attempt 1 failed by business rule unknown_po: PO 4711 unknown" in \
        texts(session, message_id)
    assert len(alerts(session, "message_failed", f"message:{message_id}")) == 1


def test_a_receipt_that_never_comes_fails_after_the_default_deadline(hub, session):
    message_id, policy = _one_message(hub, session)

    won = claim_one(session, "writer_a", "worker-a", at(0))
    _settle(session, won, Outcome.awaiting_receipt("MDN-42"), policy, at(1))
    row = delivery(session, won.delivery_id)
    assert (row.state, row.receipt_ref, row.receipt_deadline) == (
        "awaiting_receipt", "MDN-42", at(1, hours=24))
    assert message(session, message_id).status == "awaiting_receipt"

    assert run_sweep(session, at(1, hours=24), "sweeper").receipts_overdue == 0
    assert run_sweep(session, at(2, hours=24), "sweeper").receipts_overdue == 1

    row = delivery(session, won.delivery_id)
    assert (row.state, row.failure_kind, row.last_result) == (
        "failed", "technical", "no receipt within 24h")
    assert "writer_a: no receipt within 24h" in texts(session, message_id)
    assert message(session, message_id).status == "error"
    assert len(alerts(session, "message_failed", f"message:{message_id}")) == 1


@pytest.mark.parametrize("wire_started, state", [(False, "queued"), (True, "retrying")])
def test_an_interrupted_attempt_is_put_back_never_failed(hub, session, wire_started, state):
    message_id, policy = _one_message(hub, session, retry_policy={"max_attempts": 1})

    won = claim_one(session, "writer_a", "worker-a", at(0))
    assert settlement.interrupt(session, won, at(5), wire_started=wire_started,
                                reason="worker stopping", policy=policy)
    session.commit()

    row = delivery(session, won.delivery_id)
    assert (row.state, row.lease_owner, row.failure_kind) == (state, None, None)
    if wire_started:  # the partner may have it: not before the policy's delay
        assert row.due_at > at(5)
        assert message(session, message_id).status == "retrying"
    else:
        assert row.due_at == at(5)
        assert message(session, message_id).status == "received"
    assert alerts(session, "message_failed", f"message:{message_id}") == []
    assert any("attempt 1 interrupted: worker stopping" in t
               for t in texts(session, message_id))
    again = claim_one(session, "writer_a", "worker-b", row.due_at)
    assert again.attempt == 2
