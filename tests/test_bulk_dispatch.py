"""Dispatching a batch (a poller's scan) in a few statements stores exactly what
dispatching its messages one by one stores, and wakes each target once per batch it
may claim at once."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import func, select

from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.dispatch import (
    INTAKE_KEYS,
    NewMessage,
    read_settings,
    store_and_dispatch,
    store_and_dispatch_many,
)
from b2bhub.engine.settings import load_settings, save_settings
from b2bhub.models import Alert, Delivery, HistoryLine, Message, Payload
from tests.enginekit import T0, Broker, counted_statements, standard_hub


@pytest.fixture
def broker():
    stand_in = Broker()
    wakeup_module.set_publisher(stand_in)
    return stand_in


def batch(hub) -> list[NewMessage]:
    """Fan-out, a single target, not routed, targets given by an operator."""
    a, b = hub.store.put(b"UNB+UNOC:3'"), hub.store.put(b"ISA*00*~")
    return [
        NewMessage("inbox", "acme", "mycompany", {"unpacked": (a.digest, a.size)},
                   original_filename="a.edi"),
        NewMessage("inbox", "globex", "mycompany", {"raw": (b.digest, b.size),
                                                    "unpacked": (a.digest, a.size)},
                   original_filename="b.edi", external_id="X1", correlation_id="C1"),
        NewMessage("inbox", "mycompany", "acme", {"unpacked": (b.digest, b.size)}),
        NewMessage("@operator", "mycompany", "globex", {"unpacked": (a.digest, a.size)},
                   actor="alice", targets=["writer_b", "writer_b"], sequence_key="k"),
    ]


def snapshot(session, message_id: int) -> dict:
    """Everything stored for a message, without ids and in a comparable form."""
    m = session.get(Message, message_id)
    deliveries = session.scalars(select(Delivery).where(Delivery.message_id == message_id)
                                 .order_by(Delivery.id)).all()
    names = {d.id: d.target for d in deliveries}
    lines = session.scalars(select(HistoryLine).where(HistoryLine.message_id == message_id)
                            .order_by(HistoryLine.id)).all()
    return {
        "message": (m.source, m.from_party, m.to_party, m.direction, m.original_filename,
                    m.external_id, m.correlation_id, m.sequence_key, m.size, m.sha256,
                    m.status, m.status_text, m.created_at, m.updated_at),
        "payloads": sorted(session.execute(select(Payload.stage, Payload.digest,
                                                  Payload.size, Payload.created_at)
                                           .where(Payload.message_id == message_id)).all()),
        "deliveries": [(d.target, d.state, d.attempt, d.due_at, d.next_wake_at,
                        d.wake_count, d.sequence_key, d.created_at)
                       for d in deliveries],
        "history": [(h.type, h.actor, h.text, h.data, names.get(h.delivery_id),
                     h.created_at) for h in lines],
        "alerts": session.execute(select(Alert.kind, Alert.resolved_at).where(
            Alert.subject == f"message:{message_id}").order_by(Alert.id)).all(),
    }


def test_a_batch_stores_what_one_by_one_stores(hub, session, broker):
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "mycompany", "writer_a")
    hub.route("inbox", "acme", "*", "writer_b")

    one_by_one = [store_and_dispatch(session, new, T0).id for new in batch(hub)]
    session.commit()
    bulk = store_and_dispatch_many(session, batch(hub), T0)
    session.commit()

    assert len(bulk) == 4 and bulk == sorted(bulk) and min(bulk) > max(one_by_one)
    session.expire_all()
    expected = [snapshot(session, i) for i in one_by_one]
    assert [snapshot(session, i) for i in bulk] == expected
    # what the comparison covers: fan-out, not routed with its alert, given targets
    assert [len(s["deliveries"]) for s in expected] == [2, 1, 0, 1]
    assert expected[2]["message"][10] == "not_routed" and expected[2]["alerts"]
    assert expected[3]["history"][0][1] == "alice"
    # delivery ids follow the order of the batch
    made = session.execute(select(Delivery.message_id, Delivery.id)
                           .where(Delivery.message_id.in_(bulk)).order_by(Delivery.id)).all()
    assert [r.message_id for r in made] == sorted(r.message_id for r in made)


def test_delivery_ids_are_fresh_after_the_newest_delivery_is_gone(hub, session, broker):
    """Each new delivery gets a fresh id above every id in the table, also when the
    newest delivery was deleted."""
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "mycompany", "writer_a")
    hub.route("inbox", "acme", "*", "writer_b")
    first = store_and_dispatch_many(session, batch(hub), T0)
    session.commit()
    newest = session.scalar(select(func.max(Delivery.id)))
    session.execute(Delivery.__table__.delete().where(Delivery.id == newest))
    session.commit()
    second = store_and_dispatch_many(session, batch(hub), T0)
    session.commit()
    old = session.scalars(select(Delivery.id).where(Delivery.message_id.in_(first))).all()
    made = session.scalars(select(Delivery.id).where(Delivery.message_id.in_(second))
                           .order_by(Delivery.id)).all()
    assert len(made) == 4 and min(made) > max(old)
    assert session.scalar(select(func.count()).select_from(Delivery)) == len(old) + 4

def mixed_batch(hub) -> list[NewMessage]:
    """Fan-out, not routed, targets given with lines of the source's own, fan-out again."""
    stored = hub.store.put(b"UNB+UNOC:3'")
    stages = {"unpacked": (stored.digest, stored.size)}
    return [
        NewMessage("inbox", "acme", "mycompany", stages, direction="inbound"),
        NewMessage("inbox", "mycompany", "globex", stages, direction="outbound"),
        NewMessage("@operator", "mycompany", "acme", stages, direction="outbound",
                   actor="alice", targets=["writer_b", "writer_a", "writer_b"],
                   lines=[{"type": "note", "text": "by hand", "data": {"ticket": 7}},
                          {"type": "note", "text": "no data"}]),
        NewMessage("inbox", "acme", "mycompany", stages, direction="inbound"),
    ]


def test_a_dispatch_is_one_statement_on_postgresql_with_its_rows_in_order(
        hub, session, broker):
    """On PostgreSQL the messages, payload rows, deliveries and history lines of a
    dispatch go in as one statement (each statement is a round trip to the server); a
    Not routed message's status follows in statements of its own. Ids keep the order
    of the batch: message ids, delivery ids (their sequence numbers too) and history
    line ids (the SSE event ids), on both backends."""
    postgres = session.get_bind().dialect.name == "postgresql"
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.route("inbox", "*", "mycompany", "writer_a")
    hub.route("inbox", "acme", "*", "writer_b")
    store_and_dispatch_many(session, mixed_batch(hub)[:1], T0)  # routes now cached
    session.commit()

    known = read_settings(session, INTAKE_KEYS)
    with counted_statements(session.get_bind()) as one:
        store_and_dispatch_many(session, mixed_batch(hub)[:1], T0, known)
    with counted_statements(session.get_bind()) as seen:
        ids = store_and_dispatch_many(session, mixed_batch(hub), T0, known)
    session.commit()

    if postgres:  # the AS2 receiver's case: one message, routed
        assert one == {"WITH": 1}, one
        # the rest is the Not routed message's: its status read (locked, in one call
        # with its deliveries' states), then its status written with its line in one
        # statement (the second WITH), its alert (looked up first); and the targets'
        # claim batches looked up for the wake-ups
        assert seen == {"WITH": 2, "SELECT": 3, "INSERT": 1}, seen
    assert ids == sorted(ids) and len(ids) == 4
    a, b, c, d = ids
    assert session.scalars(select(Message.from_party).where(Message.id.in_(ids))
                           .order_by(Message.id)).all() == [
        "acme", "mycompany", "mycompany", "acme"]
    assert [session.get(Message, i).status for i in ids] == [
        "received", "not_routed", "received", "received"]
    made = session.execute(select(Delivery.id, Delivery.message_id,
                                  Delivery.target).where(Delivery.message_id.in_(ids))
                           .order_by(Delivery.id)).all()
    assert [(r.message_id, r.target) for r in made] == [
        (a, "writer_a"), (a, "writer_b"), (c, "writer_b"), (c, "writer_a"),
        (d, "writer_a"), (d, "writer_b")]
    delivery = {r.id: (r.message_id, r.target) for r in made}
    received = {"size": 11, "sha256": hub.store.put(b"UNB+UNOC:3'").digest}
    history = session.execute(select(HistoryLine).where(HistoryLine.message_id.in_(ids))
                              .order_by(HistoryLine.id)).scalars().all()
    assert [(h.message_id, h.type, h.actor, delivery.get(h.delivery_id), h.data)
            for h in history] == [
        (a, "received", "", None, received), (b, "received", "", None, received),
        (c, "received", "alice", None, received), (d, "received", "", None, received),
        *((m, "delivery_changed", "alice" if m == c else "", (m, t), {"state": "queued"})
          for m, t in delivery.values()),
        (b, "not_routed", "", None, None),
        (c, "note", "alice", None, {"ticket": 7}),
        (c, "note", "alice", None, None),
        (b, "status_changed", "", None, {"from": "received", "to": "not_routed"})]
    assert all(h.created_at == T0 for h in history)
    assert session.scalar(select(func.count()).select_from(Payload)
                          .where(Payload.message_id.in_(ids))) == 4


def test_wakeups_go_out_after_the_commit_once_per_claim_batch_of_each_target(
        hub, session, broker, tmp_path):
    """A woken worker claims up to its target's claim batch at a time and drains the
    target: a target is woken as often as batches of its due deliveries may run at
    once, ceil(min(due, Max Concurrent Deliveries) / claim batch)."""
    standard_hub(hub, targets=("writer_a",), max_concurrent_deliveries=40)  # batch 16
    hub.instance("writer_b", "noop", max_concurrent_deliveries=3)
    hub.instance("writer_c", "recorder", config={"record_dir": str(tmp_path)},
                 max_concurrent_deliveries=2)  # claims one at a time
    hub.route("inbox", "*", "*", "writer_a")
    hub.route("inbox", "globex", "*", "writer_b")
    hub.route("inbox", "globex", "*", "writer_c")
    stored = hub.store.put(b"payload")
    news = [NewMessage("inbox", sender, "mycompany", {"unpacked": (stored.digest, 7)})
            for sender in ["acme"] * 30 + ["globex"] * 5]

    store_and_dispatch_many(session, news, T0)
    session.flush()
    assert broker.published == []
    session.commit()

    rows = session.execute(select(Delivery.id, Delivery.target).order_by(Delivery.id)).all()
    assert len(rows) == 35 + 5 + 5
    woken = broker.take()
    for target, count in (("writer_a", 3), ("writer_b", 1), ("writer_c", 2)):
        assert [(i, t) for i, t in rows if t == target][:count] == [
            w for w in woken if w[1] == target]
    assert len(woken) == 6


def test_a_lower_claim_batch_max_setting_wakes_a_target_more_often(hub, session, broker):
    standard_hub(hub, targets=("writer_a",), max_concurrent_deliveries=40)
    hub.route("inbox", "*", "*", "writer_a")
    save_settings(session, replace(load_settings(session), claim_batch_max=4))
    stored = hub.store.put(b"payload")
    store_and_dispatch_many(session, [
        NewMessage("inbox", "acme", "mycompany", {"unpacked": (stored.digest, 7)})
        for _ in range(10)], T0)
    session.commit()

    assert len(broker.take()) == 3  # batches of 4


def test_a_rolled_back_batch_leaves_nothing_and_publishes_nothing(hub, session, broker):
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")

    store_and_dispatch_many(session, batch(hub)[:3], T0)
    session.rollback()

    assert broker.published == []
    for model in (Message, Payload, Delivery, HistoryLine):
        assert session.scalar(select(func.count()).select_from(model)) == 0


def test_an_empty_batch_does_nothing(session, broker):
    assert store_and_dispatch_many(session, [], T0) == []
    session.commit()
    assert broker.published == []


def test_rows_of_another_table_go_in_with_their_messages(hub, session, broker):
    """A source's own rows (here AS2's as2_inbound) are inserted with the batch, each
    with its message's id, JSON and times as the ORM stores them; a unique key taken
    twice fails the whole batch, no message left behind."""
    from sqlalchemy import insert, text
    from sqlalchemy.exc import IntegrityError

    from plugins.as2.models import As2Inbound
    standard_hub(hub)
    hub.route("inbox", "*", "*", "writer_a")
    inbound = As2Inbound.__table__

    def row(key, headers, due):
        return (inbound, {"instance": "as2in", "partner": "acme", "as2_message_id": key,
                          "accepted_key": key, "mdn_digest": None, "mdn_headers": headers,
                          "mdn_url": None, "mdn_state": "pending" if due else "sync",
                          "mdn_due_at": due, "mdn_attempts": 0, "mdn_last_error": "",
                          "created_at": T0})
    made = batch(hub)[:2]
    made[0].rows = [row("k1", {"Content-Type": "multipart/signed"}, T0)]
    made[1].rows = [row("k2", None, None)]
    ids = store_and_dispatch_many(session, made, T0)
    session.commit()
    # a row put in by the ORM's own INSERT, to compare how a JSON null is stored
    session.execute(insert(inbound), {**row("k3", None, None)[1], "message_id": ids[0]})
    session.commit()
    got = session.execute(select(
        inbound.c.message_id, inbound.c.accepted_key, inbound.c.mdn_headers,
        inbound.c.mdn_due_at, inbound.c.created_at, inbound.c.mdn_attempts,
        text("mdn_headers IS NULL")).order_by(inbound.c.id)).all()
    assert [tuple(r) for r in got] == [
        (ids[0], "k1", {"Content-Type": "multipart/signed"}, T0, T0, 0, False),
        (ids[1], "k2", None, None, T0, 0, False),
        (ids[0], "k3", None, None, T0, 0, False)]

    before = session.scalar(select(func.count()).select_from(Message))
    again = batch(hub)[:1]
    again[0].rows = [row("k2", None, None)]
    with pytest.raises(IntegrityError):
        store_and_dispatch_many(session, again, T0)
    session.rollback()
    assert session.scalar(select(func.count()).select_from(Message)) == before
