"""The Logs page says what an operator looks for: every configuration change, operator
action, delivery failure and retry, and every alert raised and resolved, at info. The
records go the way they go in production: the process's agent queues them and writes
them to ``log_records``; the Logs page and ``/api/v1/logs`` read them from there."""

from __future__ import annotations

import html
import logging

import pytest
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import Alert, Delivery, utcnow
from b2bhub.runtime.agent import Agent
from tests import test_ui

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
setup = test_ui.setup


@pytest.fixture
def agent(app):
    """The process's agent, as every process runs it, with the hub's loggers at info
    (``B2BHUB_LOG_LEVEL=info`` sets them so in a process)."""
    app.config["LOG_STREAM_LEVEL"] = "INFO"
    history = logging.getLogger("b2bhub.history")
    history.setLevel(logging.INFO)
    running = Agent(app, "web").start()
    yield running
    running.stop()
    history.setLevel(logging.NOTSET)


def settle_one(session, outcome: Outcome, policy: RetryPolicy) -> Delivery:
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", "w1", now, 1, 300)
    settlement.settle(session, claim, outcome, policy, now)
    session.commit()
    return session.get(Delivery, claim.delivery_id)


def test_changes_actions_failures_retries_and_alerts_are_in_the_logs(
        setup, login, session, agent, api):
    admin = login("admin", "ada")
    assert admin.post("/ui/parties/partner", data={"partner-name": "initech"}
                      ).status_code == 302
    assert admin.post("/ui/plugins/writer_a/disable").status_code == 302
    assert admin.post("/ui/plugins/writer_a/enable").status_code == 302

    retried = setup.message()
    retrying = settle_one(session, Outcome.error("io", "disk busy"),
                          RetryPolicy(base_delay=60, max_attempts=3))
    assert retrying.state == "retrying"
    failed = setup.message()
    gone = settle_one(session, Outcome.failed("disk full"), RetryPolicy())
    assert gone.state == "failed" and gone.message_id == failed.id

    operator = login("operator", "olga")
    assert operator.post(f"/ui/deliveries/{gone.id}/redeliver").status_code == 302
    now = utcnow()
    [claim] = [c for c in claiming.claim(session, "writer_a", "w1", now, 5, 300)
               if c.delivery_id == gone.id]
    settlement.settle(session, claim, Outcome.delivered("written"), RetryPolicy(), now)
    session.commit()
    alert = session.scalar(select(Alert).where(Alert.kind == "message_failed"))
    assert alert.resolved_at is not None
    agent.stop()

    page = html.unescape(login("viewer").get("/ui/logs").text)
    for said in (
            "config_changed: ada: created partner initech",
            "config_changed: ada: disabled instance writer_a",
            "config_changed: ada: enabled instance writer_a",
            f"delivery_changed message {retried.id} delivery {retrying.id} by w1: "
            "writer_a: attempt 1 failed: disk busy",
            f"delivery_changed message {failed.id} delivery {gone.id} by w1: writer_a: "
            "attempt 1 failed: disk full",
            f"alert raised: message_failed message:{failed.id}",
            f"redeliver_requested message {failed.id} delivery {gone.id}: olga asked to "
            "redeliver the delivery to writer_a",
            f"alert resolved: message_failed message:{failed.id}"):
        assert said in page, said
    records = api.get("/api/v1/logs?limit=100").get_json()["items"]
    ours = [r for r in records if r["logger"] == "b2bhub.history"]
    assert {r["level"] for r in ours} == {"info"}
    assert any("olga asked to redeliver" in r["message"] for r in ours)
    assert not any("attempt 1 started" in r["message"] for r in ours)  # routine: not said
