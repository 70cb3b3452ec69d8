"""Dispatch, claim and settle in one process: the shortest path a message takes."""

from __future__ import annotations

from sqlalchemy import select

from b2bhub.engine.runner import TargetRunner
from b2bhub.hub import new_session
from b2bhub.models import Delivery, HistoryLine, Message


def test_fan_out_two_targets_each_delivered_once(hub, session, registry, app, wakeups,
                                                 record_dir):
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("writer_a", "recorder", config={"record_dir": str(record_dir)})
    hub.instance("writer_b", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer_a")
    hub.route("inbox", "acme", "*", "writer_b")

    message = hub.message()

    deliveries = session.scalars(select(Delivery).where(
        Delivery.message_id == message.id).order_by(Delivery.target)).all()
    assert [d.target for d in deliveries] == ["writer_a", "writer_b"]
    assert {t for _, t in wakeups} == {"writer_a", "writer_b"}
    assert session.get(Message, message.id).status == "received"

    runner = TargetRunner(new_session, registry, hub.store, "test-owner")
    for target in ("writer_a", "writer_b"):
        report = runner.drain(target, budget=10)
        assert (report.claimed, report.settled) == (1, 1)
    session.expire_all()
    assert session.get(Message, message.id).status == "delivered"
    assert [d.state for d in session.get(Message, message.id).deliveries] == [
        "delivered", "delivered"]
    lines = session.scalars(select(HistoryLine.type).where(
        HistoryLine.message_id == message.id).order_by(HistoryLine.id)).all()
    assert lines[0] == "received"
    assert lines.count("delivery_changed") == 6  # queued, started, delivered x 2
    assert lines[-1] == "status_changed"

