"""Dispatch (SPEC 4, 5): fan-out, not routed, and wake-ups that go out only after commit
and never fail an intake."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub import create_app
from b2bhub.config.extensions import db
from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
from b2bhub.engine.sweep import run_sweep
from b2bhub.models import Delivery, Message
from tests.conftest import BROKER_URL, _config
from tests.enginekit import T0, Broker, alerts, at, deliveries, message, standard_hub, texts


@pytest.fixture
def broker():
    """Wake-ups go to a broker stand-in the test can lose or take down."""
    stand_in = Broker()
    wakeup_module.set_publisher(stand_in)
    return stand_in


def test_two_routes_to_two_targets_make_two_deliveries(hub, session, broker):
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "*", "writer_a")
    hub.route("inbox", "acme", "*", "writer_b")

    sent = hub.message(now=T0)

    rows = deliveries(session, sent.id)
    assert [(d.target, d.state, d.attempt) for d in rows] == [
        ("writer_a", "queued", 0), ("writer_b", "queued", 0)]
    assert sorted(broker.take()) == sorted((d.id, d.target) for d in rows)
    assert message(session, sent.id).status == "received"


def test_overlapping_routes_to_one_target_make_one_delivery(hub, session, broker):
    standard_hub(hub)
    # neither covers the other, so both may be saved; acme -> mycompany matches both
    hub.route("inbox", "acme", "*", "writer_a")
    hub.route("inbox", "*", "mycompany", "writer_a")

    sent = hub.message(from_party="acme", to_party="mycompany", now=T0)

    assert [d.target for d in deliveries(session, sent.id)] == ["writer_a"]
    assert [t for _, t in broker.take()] == ["writer_a"]


def test_message_without_a_route_is_not_routed_with_an_open_alert(hub, session, broker):
    standard_hub(hub)
    hub.route("inbox", "globex", "*", "writer_a")

    sent = hub.message(from_party="acme", now=T0)

    assert deliveries(session, sent.id) == []
    assert message(session, sent.id).status == "not_routed"
    assert "no route from inbox matches acme → mycompany" in texts(session, sent.id)
    [alert] = alerts(session, "message_not_routed", f"message:{sent.id}")
    assert alert.resolved_at is None and alert.message_id == sent.id
    assert broker.take() == []


def test_wakeups_are_published_only_after_the_commit(hub, session, broker):
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    store = hub.store.put(b"UNA:+.? '")

    sent = store_and_dispatch(session, NewMessage(
        "inbox", "acme", "mycompany", {"unpacked": (store.digest, store.size)}), T0)
    session.flush()
    assert broker.published == []  # stored, dispatched, not committed: nothing out yet

    session.commit()
    [(delivery_id, target)] = broker.take()
    assert target == "writer_a"
    assert [d.id for d in deliveries(session, sent.id)] == [delivery_id]


def test_a_rolled_back_dispatch_publishes_nothing(hub, session, broker):
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    store = hub.store.put(b"ISA*00*~")

    store_and_dispatch(session, NewMessage(
        "inbox", "acme", "mycompany", {"unpacked": (store.digest, store.size)}), T0)
    session.flush()
    session.rollback()
    assert broker.published == []

    # the dropped wake-ups do not ride along with the next transaction that commits
    hub.instance("writer_b", "noop")
    assert broker.published == []
    assert session.scalar(select(func.count()).select_from(Message)) == 0
    assert session.scalar(select(func.count()).select_from(Delivery)) == 0


def test_a_broker_that_is_down_never_fails_an_intake(hub, session, broker):
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    broker.down = True

    sent = hub.message(now=T0)  # commits although publishing raises

    with Session(db.engine) as other:  # another connection sees it committed
        stored = other.get(Message, sent.id)
        assert stored is not None and stored.status == "received"
        [row] = other.scalars(select(Delivery).where(Delivery.message_id == sent.id))
        assert (row.target, row.state) == ("writer_a", "queued")

    broker.down = False
    assert run_sweep(session, at(9), "sweeper").woken == 0
    assert broker.take() == []
    assert run_sweep(session, at(10), "sweeper").woken == 1
    assert broker.take() == [(row.id, "writer_a")]


def test_the_celery_publisher_with_an_unreachable_broker_never_fails_an_intake(
        hub, session, backend, registry):
    """The real publisher, pointed at a port where no broker listens."""
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    # an app without WAKEUP_PUBLISHER installs its CeleryPublisher
    create_app(_config(backend, PLUGIN_REGISTRY=registry, BROKER_URL="redis://127.0.0.1:9/0"))

    started = time.monotonic()
    sent = hub.message(now=T0)

    assert time.monotonic() - started < 3  # no connection retries inside the intake
    [row] = deliveries(session, sent.id)
    assert (row.target, row.state) == ("writer_a", "queued")
    assert message(session, sent.id).status == "received"


@pytest.mark.skipif(not BROKER_URL.startswith("redis"), reason=(
    "the Redis publisher needs a Redis broker (B2BHUB_TEST_BROKER_URL); the embedded "
    "broker publishes through send_task"))
def test_the_redis_publisher_pushes_the_message_send_task_would(backend, registry):
    """A wake-up pushed by RedisWakeups is, but for its ids, the message Celery's
    send_task publishes: a worker takes it the same way. Wake-ups of one call to two
    queues arrive each on its queue, in the order sent."""
    import json
    import uuid

    from b2bhub.runtime.hub import DELIVER_TASK, RedisWakeups
    from celeryconfig import delivery_queue
    app = create_app(_config(backend, PLUGIN_REGISTRY=registry))
    celery = app.extensions["celery"]
    pusher = RedisWakeups.for_app(celery)
    assert pusher is not None
    first, second = (delivery_queue(f"test-wakeups-{uuid.uuid4().hex}") for _ in range(2))
    client = pusher.client
    try:
        celery.send_task(DELIVER_TASK, args=["writer_a", 7], retry=False, exchange="",
                         routing_key=first.name, queue=first)
        pusher.send([(first, "writer_a", 7), (second, "writer_b", 8), (first, "writer_a", 9)])
        sent, *pushed = [json.loads(m) for m in reversed(client.lrange(first.name, 0, -1))]
        [other] = [json.loads(m) for m in client.lrange(second.name, 0, -1)]
    finally:
        client.delete(first.name, second.name)

    def masked(message: dict) -> dict:
        task_id = message["headers"]["id"]
        assert message["headers"]["root_id"] == message["properties"]["correlation_id"] == task_id
        assert message["properties"]["delivery_tag"] not in ("", task_id)
        return {**message, "headers": {**message["headers"], "id": "", "root_id": ""},
                "properties": {**message["properties"], "correlation_id": "",
                               "delivery_tag": ""}}

    assert masked(pushed[0]) == masked(sent)
    assert len({m["headers"]["id"] for m in (sent, *pushed, other)}) == 4
    assert [m["headers"]["argsrepr"] for m in (*pushed, other)] == [
        "['writer_a', 7]", "['writer_a', 9]", "['writer_b', 8]"]
    assert other["properties"]["delivery_info"]["routing_key"] == second.name
    # made from a template per queue and target: names JSON or repr quote differently,
    # and one holding the template's own mark of the delivery id, are sent as Celery would
    for target in ("it's \"quoted\"", "ünïcode", "918273645546372819", "writer_a"):
        try:
            celery.send_task(DELIVER_TASK, args=[target, 918273645546372819], retry=False,
                             exchange="", routing_key=first.name, queue=first)
            pusher.send([(first, target, 918273645546372819)])
            sent, pushed = [json.loads(m) for m in reversed(client.lrange(first.name, 0, -1))]
        finally:
            client.delete(first.name)
        assert masked(pushed) == masked(sent), target
        assert pushed["headers"]["argsrepr"] == repr([target, 918273645546372819])


def test_read_settings_sees_the_transactions_own_rows_and_maps_missing_keys_to_none(
        session):
    """The intake reads its settings rows on the session's connection: rows added in the
    same transaction (flushed or not) are seen, committed ones too, a key without a row
    is None, and the same keys asked twice give the same answer."""
    from b2bhub.engine.dispatch import read_settings
    from b2bhub.models import Setting

    session.add(Setting(key="k_a", value={"n": 1}))
    session.commit()
    session.add(Setting(key="k_b", value=[2]))  # pending, not flushed
    keys = ("k_a", "k_b", "k_missing")
    assert read_settings(session, keys) == {"k_a": {"n": 1}, "k_b": [2],
                                            "k_missing": None}
    session.rollback()
    assert read_settings(session, list(keys)) == {"k_a": {"n": 1}, "k_b": None,
                                                  "k_missing": None}
