"""The nightly cleanup (SPEC 13): what it removes, what it keeps, the run it records, and
the payload files it never loses."""

from __future__ import annotations

import os
import threading
import time

import pytest
from sqlalchemy import func, select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retention import BatchSizer
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.cleanup import cleanup_due, run_cleanup
from b2bhub.engine.machine import claiming, settlement
from b2bhub.engine.settings import DeliverySettings, load_settings, save_settings
from b2bhub.engine.sweep import SweepGuard
from b2bhub.models import (
    Alert,
    CleanupRun,
    Delivery,
    HistoryLine,
    Message,
    Payload,
)
from b2bhub.runtime import hub as hub_module
from b2bhub.services import config as svc
from tests.enginekit import T0, at, claim_one, standard_hub
from tests.factories import digests_in

NO_RETRY = RetryPolicy.from_dict({"strategy": "fixed", "base_delay": 60, "max_attempts": 1})
RETRY = RetryPolicy.from_dict({"strategy": "fixed", "base_delay": 60, "max_attempts": 9})


def age_files(store, digests, seconds: float = 7200) -> None:
    """Make payload files as old on disk as the messages that hold them."""
    then = time.time() - seconds
    for digest in digests:
        os.utime(store.path(digest), (then, then))


def digests_of(session, message_id: int) -> list[str]:
    return list(session.scalars(select(Payload.digest).where(Payload.message_id == message_id)))


def settle_all(session, target: str, outcome: Outcome, policy: RetryPolicy, now) -> None:
    while claims := claiming.claim(session, target, "worker", now, 16, 300):
        session.commit()
        for claim in claims:
            assert settlement.settle(session, claim, outcome, policy, now)
        session.commit()


def exists(session, message_id: int) -> bool:
    session.expire_all()
    return session.get(Message, message_id) is not None


@pytest.fixture
def store(app):
    return hub_module.store()


@pytest.fixture
def scene(hub, session, store):
    """Messages of every kind at T0 (40 days before the run) and one young one."""
    standard_hub(hub, targets=("writer_a", "writer_b"))
    hub.instance("forever_in", "manual_source", retention_days=-1)
    hub.instance("short_in", "manual_source", retention_days=5)
    hub.route("inbox", "acme", "*", "writer_a")
    hub.route("inbox", "globex", "*", "writer_a")
    hub.route("inbox", "globex", "*", "writer_b")
    hub.route("forever_in", "*", "*", "writer_a")
    hub.route("short_in", "*", "*", "writer_a")
    m = {}
    m["delivered"] = hub.message(now=T0, body=b"delivered").id
    m["shared"] = hub.message(now=T0, body=b"shared body").id
    m["forever"] = hub.message(source="forever_in", now=T0, body=b"forever").id
    m["short"] = hub.message(source="short_in", now=at(days=30), body=b"short").id
    m["default_10d"] = hub.message(now=at(days=30), body=b"ten days").id
    m["young"] = hub.message(now=at(days=40), body=b"shared body").id
    settle_all(session, "writer_a", Outcome.delivered(), NO_RETRY, at(days=40))
    m["retrying"] = hub.message(now=T0, body=b"retrying").id
    settle_all(session, "writer_a", Outcome.error("connection", "refused"), RETRY, at(2))
    # error on writer_a but writer_b retrying: the status is Error, a delivery is open
    m["error_open"] = hub.message(now=T0, from_party="globex", body=b"half").id
    claim = claim_one(session, "writer_a", "worker", at(3))
    assert settlement.settle(session, claim, Outcome.error("x", "no"), NO_RETRY, at(3))
    claim = claim_one(session, "writer_b", "worker", at(3))
    assert settlement.settle(session, claim, Outcome.error("x", "no"), RETRY, at(3))
    session.commit()
    m["not_routed"] = hub.message(now=T0, from_party="mycompany", to_party="acme",
                                  body=b"nobody").id
    m["in_flight"] = hub.message(now=T0, body=b"queued still").id  # queued, never claimed
    session.add(Alert(kind="message_failed", subject=f"message:{m['not_routed']}",
                      message_id=m["not_routed"], text="x"))
    session.add(Alert(kind="message_failed", subject=f"message:{m['error_open']}",
                      message_id=m["error_open"], text="x"))
    session.commit()
    statuses = dict(session.execute(select(Message.id, Message.status)).all())
    assert statuses[m["delivered"]] == "delivered"
    assert statuses[m["retrying"]] == "retrying"
    assert statuses[m["error_open"]] == "error"
    assert statuses[m["not_routed"]] == "not_routed"
    assert statuses[m["in_flight"]] == "received"
    age_files(store, digests_in(store))
    return m


GONE = ("delivered", "shared", "not_routed", "short")
KEPT = ("retrying", "error_open", "forever", "in_flight", "default_10d", "young")


def test_removes_final_messages_past_retention_and_keeps_the_rest(scene, session, store):
    files = {name: digests_of(session, mid) for name, mid in scene.items()}
    kept_alerts = session.scalar(select(func.count()).select_from(Alert).where(
        Alert.message_id == scene["error_open"]))
    report = run_cleanup(session, store, at(days=40, seconds=60), "tests")
    assert report.ran and report.messages == len(GONE)
    for name in GONE:
        assert not exists(session, scene[name]), name
    for name in KEPT:
        assert exists(session, scene[name]), name
    gone_ids = [scene[n] for n in GONE]
    for model in (Delivery, HistoryLine, Payload, Alert):
        assert session.scalar(select(func.count()).select_from(model).where(
            model.message_id.in_(gone_ids))) == 0, model.__name__
    assert session.scalar(select(func.count()).select_from(Alert).where(
        Alert.message_id == scene["error_open"])) == kept_alerts > 0
    for name in ("delivered", "not_routed", "short"):
        assert not any(store.exists(d) for d in files[name]), name
    # the shared body is still referenced by the young message
    assert all(store.exists(d) for d in files["shared"])
    for name in KEPT:
        assert all(store.exists(d) for d in files[name]), name
    [run] = session.scalars(select(CleanupRun)).all()
    assert (run.state, run.messages_removed, run.files_removed) == ("finished", 4, 3)
    assert run.bytes_removed == len(b"delivered") + len(b"nobody") + len(b"short")
    assert report.bytes == run.bytes_removed


def test_a_tight_budget_deletes_in_smaller_batches_and_removes_the_same(
        scene, session, store):
    """Batches sized to the time budget: one that took longer makes the next smaller,
    and nothing else about the run changes (the same messages removed, the rest kept)."""
    report = run_cleanup(session, store, at(days=40, seconds=60), "tests", batch=3,
                         budget=1e-9)
    assert report.messages == len(GONE)
    # 5 candidates (error_open is final but has a delivery open): 3, then one at a time
    assert (report.largest_batch, report.batches) == (3, 3)
    for name in GONE:
        assert not exists(session, scene[name]), name
    for name in KEPT:
        assert exists(session, scene[name]), name


def test_a_batch_given_by_hand_is_kept_whatever_it_takes(scene, session, store):
    """``b2bhub cleanup --batch N``: N messages a transaction, not sized to the budget."""
    report = run_cleanup(session, store, at(days=40, seconds=60), "tests", batch=2,
                         budget=None)
    assert report.messages == len(GONE)
    assert (report.largest_batch, report.batches) == (2, 3)  # 5 candidates: 2, 2, 1


def test_batch_sizes_follow_the_time_each_full_batch_took():
    sizer = BatchSizer(500, budget=0.1, smallest=20, largest=5000)
    sizer.record(500, 0.4)  # four times the budget: cut in proportion, with a margin
    assert sizer.size == 100
    sizer.record(10, 5.0)  # a short batch (the last) says nothing of the size
    assert sizer.size == 100
    sizer.record(100, 0.07)  # within the budget but over half of it: kept
    assert sizer.size == 100
    sizer.record(100, 0.01)  # well under: grows by a quarter
    assert sizer.size == 125
    for _ in range(60):
        sizer.record(sizer.size, 0.001)
    assert sizer.size == 5000
    for _ in range(60):
        sizer.record(sizer.size, 60.0)
    assert sizer.size == 20
    assert BatchSizer(1, smallest=20).size == 20


def test_dry_run_says_what_and_removes_nothing(scene, session, store):
    before = session.scalar(select(func.count(Message.id)))
    report = run_cleanup(session, store, at(days=40, seconds=60), "tests", dry_run=True)
    assert (report.messages, report.files) == (len(GONE), 3)
    assert "would remove 4 messages" in report.summary()
    assert session.scalar(select(func.count(Message.id))) == before
    assert session.scalar(select(func.count(CleanupRun.id))) == 0
    assert run_cleanup(session, store, at(days=40, seconds=60), "tests").messages == 4


def test_a_young_file_is_kept_even_unreferenced(app, session, store):
    young = store.put(b"written, transaction not committed yet")
    old = store.put(b"left by a process that died")
    age_files(store, [old.digest])
    report = run_cleanup(session, store, T0, "tests")
    assert store.exists(young.digest) and not store.exists(old.digest)
    assert (report.files, report.orphan_files, report.bytes) == (1, 1, old.size)


def test_a_plugins_table_keeps_the_payload_its_rows_reference(hub, session, store):
    """AS2 keeps a received message's MDN in the store, named only by its own table:
    the AS2 plugin declares that reference (Plugin.payload_references) and the cleanup
    keeps that file while the message is kept, though no payload row names it."""
    from b2bhub.engine.cleanup import plugin_references
    from b2bhub.plugin.registry import PluginRegistry
    from plugins.as2.models import As2Inbound
    from plugins.as2.plugin import As2Receiver
    standard_hub(hub)
    kept = hub.message(now=at(days=1))  # young: kept, with its MDN
    mdn = store.put(b"the MDN we answered with")
    session.add(As2Inbound(instance="inbox", partner="acme", as2_message_id="<m1@acme>",
                           message_id=kept.id, mdn_digest=mdn.digest))
    session.commit()
    age_files(store, [mdn.digest])
    registry = PluginRegistry()
    registry.register(As2Receiver)
    references = plugin_references(registry)
    assert len(references) == 1
    report = run_cleanup(session, store, at(days=2), "tests", references=references)
    assert store.exists(mdn.digest) and report.orphan_files == 0
    # without the plugin's word, nothing would have kept it
    run_cleanup(session, store, at(days=2, seconds=1), "tests")
    assert not store.exists(mdn.digest)


def test_one_process_at_a_time(scene, session, store, db):
    other = hub_module.new_session()
    from b2bhub.engine import cleanup
    with SweepGuard(other, "someone-else", at(days=40), name=cleanup.LOCK_NAME,
                    key=cleanup.ADVISORY_KEY) as held:
        assert held
        report = run_cleanup(session, store, at(days=40, seconds=1), "tests")
        assert not report.ran
        assert exists(session, scene["delivered"])
    other.close()
    assert run_cleanup(session, store, at(days=40, seconds=2), "tests").messages == 4


def test_due_once_a_day_after_the_configured_time(session, app, store):
    settings = DeliverySettings(cleanup_time="03:30")
    assert not cleanup_due(session, at(hours=-6, minutes=29), settings)  # 03:29 that day
    assert cleanup_due(session, at(hours=-5, minutes=-30), settings)  # 03:30
    run_cleanup(session, store, at(hours=-5), "tests")
    assert not cleanup_due(session, at(hours=-4), settings)
    assert cleanup_due(session, at(days=1, hours=-5), settings)  # the next night
    # a run killed mid-way is no run: the next tick starts another
    session.add(CleanupRun(started_at=at(days=1, hours=-5), state="running"))
    session.commit()
    assert cleanup_due(session, at(days=1, hours=-4), settings)
    run_cleanup(session, store, at(days=1, hours=-4), "tests")
    states = session.scalars(select(CleanupRun.state).order_by(CleanupRun.id)).all()
    assert states == ["finished", "interrupted", "finished"]


def test_retention_days_default_keep_forever_and_refusals(hub, session, api):
    hub.instance("inbox", "manual_source")
    save_settings(session, DeliverySettings(retention_days=12))
    session.commit()
    assert load_settings(session).retention_days == 12
    for value in (0, None, 7, -1):
        resp = api.put("/api/v1/plugins/configs/inbox", json={"retention_days": value})
        assert resp.status_code == 200, resp.get_json()
        assert resp.get_json()["retention_days"] == value
    resp = api.put("/api/v1/plugins/configs/inbox", json={"retention_days": -2})
    assert resp.status_code == 400
    assert svc.get_instance(session, "inbox").retention_days == -1


def test_orphan_removal_never_removes_a_payload_a_committed_row_references(
        hub, session, store, app):
    """A message stored with the same content as an old unreferenced file while the
    orphan removal looks at that very file, over and over, with a reference check slow
    enough for the message to be stored and committed in between: the committed row's
    file is always there."""
    standard_hub(hub)
    body = b"the same content, again and again"
    stop = threading.Event()
    errors: list[BaseException] = []
    looked = []

    def removing():
        with app.app_context():
            own = hub_module.new_session()

            def referenced(digest: str) -> bool:
                found = own.scalar(select(func.count(Payload.id)).where(
                    Payload.digest == digest)) > 0
                own.commit()
                time.sleep(0.01)  # a slow database: the intake commits meanwhile
                looked.append(found)
                return found

            try:
                while not stop.is_set():
                    for digest in [d for d, _s, age in store.walk() if age > 3600]:
                        store.remove_unreferenced(digest, referenced, time.time() - 3600)
                    time.sleep(0.001)
            except BaseException as exc:  # noqa: BLE001  (shown by the test)
                errors.append(exc)
            finally:
                own.close()

    remover = threading.Thread(target=removing)
    remover.start()
    try:
        for i in range(60):
            digest = store.put(body).digest
            age_files(store, [digest])  # old and unreferenced: a removal candidate
            time.sleep(0.002 * (i % 8))  # the removal at each point of its check
            sent = hub.message(body=body).id  # stores it again, then commits a row
            assert store.exists(digest), "a committed row's payload was removed"
            with store.open(digest) as f:
                assert f.read() == body
            session.execute(Message.__table__.delete().where(Message.id == sent))
            session.commit()
    finally:
        stop.set()
        remover.join()
    assert not errors
    assert looked.count(False) > 10  # it did look at the file while unreferenced
