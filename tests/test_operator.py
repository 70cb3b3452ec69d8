"""Operator actions: each one a history line naming the operator, guarded by state."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from sqlalchemy import event, select, update

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import operator
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import Alert, Delivery, HistoryLine, Message, utcnow

OWNER = "worker-a"


@pytest.fixture
def setup(hub, record_dir):
    hub.parties()
    hub.instance("inbox", "manual_source")
    for name in ("writer_a", "writer_b"):
        hub.instance(name, "recorder", config={"record_dir": str(record_dir)})
    return hub


def _lines(session, message_id, type_=None):
    query = select(HistoryLine).where(HistoryLine.message_id == message_id)
    if type_:
        query = query.where(HistoryLine.type == type_)
    return session.scalars(query.order_by(HistoryLine.id)).all()


def _fail(session, message_id, target="writer_a"):
    now = utcnow()
    [claim] = claiming.claim(session, target, OWNER, now, 1, 300)
    settlement.settle(session, claim, Outcome.failed("disk on fire"), RetryPolicy(), now)
    session.commit()
    return claim.delivery_id


def test_redispatch_after_adding_a_route_creates_only_the_missing_delivery(setup, session,
                                                                          wakeups):
    message = setup.message()
    assert message.status == "not_routed"
    assert session.scalar(select(Alert.kind).where(Alert.resolved_at.is_(None))) == \
        "message_not_routed"
    setup.route("inbox", "*", "*", "writer_a")
    wakeups.clear()

    result = operator.redispatch(session, message.id, "alice", utcnow())
    session.commit()

    assert result.changed and "writer_a" in result.text
    targets = session.scalars(select(Delivery.target).where(
        Delivery.message_id == message.id)).all()
    assert targets == ["writer_a"]
    assert [t for _, t in wakeups] == ["writer_a"]
    assert session.get(Message, message.id).status == "received"
    [line] = _lines(session, message.id, "redispatch_requested")
    assert line.actor == "alice"
    assert session.scalar(select(Alert.id).where(Alert.kind == "message_not_routed",
                                                 Alert.resolved_at.is_(None))) is None

    again = operator.redispatch(session, message.id, "alice", utcnow())
    session.commit()
    assert not again.changed and "nothing is new" in again.text
    assert session.scalars(select(Delivery.target).where(
        Delivery.message_id == message.id)).all() == ["writer_a"]


def test_redispatch_keeps_existing_deliveries_as_they_are(setup, session):
    setup.route("inbox", "*", "*", "writer_a")
    message = setup.message()
    delivery_id = _fail(session, message.id)
    setup.route("inbox", "acme", "*", "writer_b")

    operator.redispatch(session, message.id, "alice", utcnow())
    session.commit()

    states = dict(session.execute(select(Delivery.target, Delivery.state).where(
        Delivery.message_id == message.id)).all())
    assert states == {"writer_a": "failed", "writer_b": "queued"}
    assert session.get(Delivery, delivery_id).state == "failed"


def test_redeliver_a_failed_delivery_queues_it_and_clears_the_failure(setup, session,
                                                                     wakeups):
    setup.route("inbox", "*", "*", "writer_a")
    message = setup.message()
    delivery_id = _fail(session, message.id)
    assert session.get(Message, message.id).status == "error"
    wakeups.clear()

    operator.redeliver(session, delivery_id, "bob", utcnow())
    session.commit()

    delivery = session.get(Delivery, delivery_id)
    assert (delivery.state, delivery.failures, delivery.failure_kind) == ("queued", 0, None)
    assert delivery.attempt == 1  # the counter keeps growing with the next claim
    assert wakeups == [(delivery_id, "writer_a")]
    assert session.get(Message, message.id).status == "received"
    assert _lines(session, message.id, "redeliver_requested")[0].actor == "bob"
    assert session.scalar(select(Alert.id).where(Alert.kind == "message_failed",
                                                 Alert.resolved_at.is_(None))) is None
    [claim] = claiming.claim(session, "writer_a", OWNER, utcnow(), 1, 300)
    assert claim.attempt == 2


def test_redeliver_refuses_a_delivered_delivery_and_changes_nothing(setup, session):
    setup.route("inbox", "*", "*", "writer_a")
    message = setup.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", OWNER, now, 1, 300)
    settlement.settle(session, claim, Outcome.delivered("ok"), RetryPolicy(), now)
    session.commit()
    before = len(_lines(session, message.id))

    with pytest.raises(operator.ActionRefused, match="Delivered"):
        operator.redeliver(session, claim.delivery_id, "bob", utcnow())
    session.rollback()
    assert len(_lines(session, message.id)) == before

    operator.send_again(session, claim.delivery_id, "bob", utcnow())
    session.commit()
    assert session.get(Delivery, claim.delivery_id).state == "queued"
    assert _lines(session, message.id, "send_again_requested")[0].actor == "bob"


def _redeliver_all(session, hook: tuple):
    """The bulk Redeliver of every delivery by ``bob`` with ``hook`` (target, event
    name, listener) listened to while it runs."""
    event.listen(*hook)
    try:
        return operator.redeliver_many(session, select(Delivery), 100, "bob", utcnow())
    finally:
        event.remove(*hook)


def test_bulk_redeliver_skips_a_delivery_that_changed_before_its_turn(setup, session):
    """The one bulk Redeliver of the API and the UI: a delivery a worker claims between
    the selection and its turn is left exactly as the worker left it (no history line of
    a redeliver that did not happen); the others still go, and both lists say so."""
    setup.route("inbox", "*", "*", "writer_a")
    messages = [setup.message() for _ in range(3)]
    failed = [_fail(session, m.id) for m in messages]
    middle = failed[1]

    def claimed_meanwhile(state):
        # the moment the redeliver of the middle delivery moves it, a worker has just
        # claimed it: its state is no longer the one the redeliver read
        if state.is_update and getattr(state.statement, "table", None) is not None \
                and state.statement.table.name == "deliveries" \
                and re.search(rf"\bid = {middle}\b", str(state.statement.compile(
                    compile_kwargs={"literal_binds": True}))):
            state.session.connection().execute(update(Delivery).where(
                Delivery.id == middle).values(state="in_progress", lease_owner=OWNER))

    result = _redeliver_all(session, (session, "do_orm_execute", claimed_meanwhile))
    session.commit()

    assert (result.redelivered, result.skipped, result.more) == (
        [failed[0], failed[2]], [middle], False)
    session.expire_all()
    # the stand-in claim ran on the redeliver's own connection, inside its savepoint, so
    # it went with the rollback: the row is as it was before either touched it
    assert [session.get(Delivery, i).state for i in failed] == ["queued", "failed", "queued"]
    assert _lines(session, messages[1].id, "redeliver_requested") == []
    for message in (messages[0], messages[2]):
        assert _lines(session, message.id, "redeliver_requested")[0].actor == "bob"


def test_bulk_redeliver_goes_through_when_another_process_writes_between_its_read_and_write(
        setup, session):
    """A worker or beat committing while the bulk Redeliver runs (between the read and
    the write of a delivery's redeliver) delays one of the two, fails neither. On SQLite
    the savepoint used to begin a reader's transaction, which SQLite then refused to let
    write ("database is locked", a 500 in the UI): b2bhub.config.database."""
    setup.route("inbox", "*", "*", "writer_a")
    failed = [_fail(session, setup.message().id) for _ in range(2)]
    other = setup.message().id
    session.commit()
    elsewhere: list = []
    engine = session.get_bind()

    def a_worker_commits():
        try:
            with engine.begin() as conn:
                conn.execute(update(Message).where(Message.id == other).values(
                    correlation_id="written by another process"))
            elsewhere.append("committed")
        except Exception as error:  # reported by the assertion below
            elsewhere.append(error)

    writer = threading.Thread(target=a_worker_commits)

    def commit_elsewhere(conn, cursor, statement, *args):
        # before the redeliver's first write, after its reads
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) \
                and writer.ident is None:  # not started yet
            writer.start()
            writer.join(2)  # done at once where nothing holds the database for writing

    result = _redeliver_all(session, (session.connection(), "before_cursor_execute",
                                      commit_elsewhere))
    session.commit()
    writer.join(30)

    assert (result.redelivered, result.skipped) == (failed, [])
    assert elsewhere == ["committed"]
    session.expire_all()
    assert [session.get(Delivery, i).state for i in failed] == ["queued", "queued"]
    assert session.get(Message, other).correlation_id == "written by another process"


def test_bulk_redeliver_takes_at_most_max_oldest_first(setup, session):
    setup.route("inbox", "*", "*", "writer_a")
    failed = [_fail(session, setup.message().id) for _ in range(3)]
    first = operator.redeliver_many(session, select(Delivery), 2, "bob", utcnow())
    session.commit()
    assert (first.redelivered, first.skipped, first.more) == (failed[:2], [], True)
    rest = operator.redeliver_many(session, select(Delivery), 2, "bob", utcnow())
    assert (rest.redelivered, rest.more) == (failed[2:], False)  # the first two are queued


def test_cancel_in_progress_delivery_refuses_the_late_outcome(setup, session):
    setup.route("inbox", "*", "*", "writer_a")
    message = setup.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", OWNER, now, 1, 300)
    session.commit()

    operator.cancel_delivery(session, claim.delivery_id, "carol", now)
    session.commit()
    assert not settlement.settle(session, claim, Outcome.delivered("late"), RetryPolicy(),
                                 now + timedelta(seconds=1))
    session.commit()

    assert session.get(Delivery, claim.delivery_id).state == "cancelled"
    assert session.get(Message, message.id).status == "cancelled"
    assert _lines(session, message.id, "cancel_requested")[0].actor == "carol"
    assert len(_lines(session, message.id, "stale_outcome_ignored")) == 1


def test_cancel_message_cancels_open_deliveries_and_keeps_delivered_ones(setup, session):
    setup.route("inbox", "*", "*", "writer_a")
    setup.route("inbox", "*", "*", "writer_b")
    message = setup.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", OWNER, now, 1, 300)
    settlement.settle(session, claim, Outcome.delivered("ok"), RetryPolicy(), now)
    session.commit()

    operator.cancel_message(session, message.id, "carol", now)
    session.commit()

    states = dict(session.execute(select(Delivery.target, Delivery.state).where(
        Delivery.message_id == message.id)).all())
    assert states == {"writer_a": "delivered", "writer_b": "cancelled"}
    with pytest.raises(operator.ActionRefused, match="nothing left to cancel"):
        operator.cancel_message(session, message.id, "carol", now)


def test_cancel_a_not_routed_message(setup, session):
    message = setup.message()
    operator.cancel_message(session, message.id, "carol", utcnow())
    session.commit()
    session.expire_all()
    assert session.get(Message, message.id).status == "cancelled"
    assert session.scalar(select(Alert.id).where(Alert.kind == "message_not_routed",
                                                 Alert.resolved_at.is_(None))) is None
