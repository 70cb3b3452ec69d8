"""Dispatch, claim and settle in one process: the shortest path a message takes."""

from __future__ import annotations

from sqlalchemy import select

from b2bhub.engine.runner import TargetRunner
from b2bhub.models import Delivery, HistoryLine, Message
from b2bhub.runtime.hub import new_session


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



def test_a_batch_whose_messages_cannot_be_read_goes_back_at_once(hub, session, registry,
                                                                 monkeypatch):
    """The database went away right after a claim committed (a PostgreSQL restart cut
    the connection while the batch's messages were read): the claimed deliveries go
    back to the queue now, with a line saying why, instead of staying leased to this
    live worker until the lease runs out."""
    import pytest
    from sqlalchemy.exc import OperationalError

    from b2bhub.engine import runner as runner_module
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("out", "noop")
    hub.route("inbox", "*", "*", "out")
    first, second = hub.message(), hub.message()
    real = runner_module._delivery_infos
    calls = []

    def cut_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("SELECT ...", {}, Exception("server closed the connection"))
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "_delivery_infos", cut_once)
    runner = TargetRunner(new_session, registry, hub.store, "test-owner")
    with pytest.raises(OperationalError):
        runner.drain("out", 10)
    session.expire_all()
    rows = session.scalars(select(Delivery).order_by(Delivery.id)).all()
    assert [(d.state, d.attempt, d.lease_owner) for d in rows] == [
        ("queued", 1, None), ("queued", 1, None)]
    assert session.scalars(select(HistoryLine.text).where(
        HistoryLine.text.contains("could not read the batch: OperationalError"))).all()
    runner.drain("out", 10)  # the next wake-up delivers them, fenced by a new attempt
    session.expire_all()
    assert [(d.state, d.attempt) for d in session.scalars(
        select(Delivery).order_by(Delivery.id))] == [("delivered", 2), ("delivered", 2)]
    assert {m.status for m in (session.get(Message, first.id),
                               session.get(Message, second.id))} == {"delivered"}
