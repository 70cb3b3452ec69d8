"""The nightly cleanup as it runs: started by a real beat in a real worker, and killed
with SIGKILL mid-run from the command line, on the backend under test."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from datetime import timedelta

import pytest
from flask import g
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.models import (
    CleanupRun,
    Delivery,
    HistoryLine,
    Message,
    Payload,
    Setting,
    utcnow,
)
from b2bhub.runtime import hub as hub_module
from b2bhub.runtime.hub import CeleryPublisher
from b2bhub.services.users import create_user
from tests.factories import digests_in
from tests.procs import BIN, ROOT, wait_until

pytestmark = pytest.mark.processes
OLD = timedelta(days=40)


def fresh(stmt):
    with Session(db.engine) as s:
        return s.execute(stmt).all()


def age_all_files(store, seconds: float = 7200) -> None:
    then = time.time() - seconds
    for digest in digests_in(store):
        os.utime(store.path(digest), (then, then))


def status_of(message_id: int) -> str | None:
    found = fresh(select(Message.status).where(Message.id == message_id))
    return found[0][0] if found else None


def test_beat_runs_the_cleanup_at_its_time_in_a_worker(procs, hub, session, app,
                                                       record_dir):
    """Old final messages and their files go; young ones, one still queued and one
    retrying (however old) stay; the run shows on System > Services."""
    wakeup_module.set_publisher(CeleryPublisher(app).publish)
    store = hub_module.store()
    hub.parties(organizations=("mycompany",), partners=("acme", "globex", "initech"))
    hub.instance("inbox", "manual_source")
    hub.instance("ok_t", "noop")
    hub.instance("retry_t", "recorder", config={"record_dir": str(record_dir),
                                                "fail_attempts": 1000},
                 retry_policy={"strategy": "fixed", "base_delay": 3600, "max_attempts": 99})
    hub.instance("unserved_t", "noop", queue="nobody_serves_this")
    hub.route("inbox", "acme", "*", "ok_t")
    hub.route("inbox", "globex", "*", "retry_t")
    hub.route("inbox", "initech", "*", "unserved_t")
    now = utcnow()
    old_ok = [hub.message(now=now - OLD, body=f"old {i}".encode()).id for i in range(3)]
    old_retrying = hub.message(from_party="globex", now=now - OLD, body=b"retrying").id
    old_queued = hub.message(from_party="initech", now=now - OLD, body=b"queued").id
    young = hub.message(now=now, body=b"young").id
    files = {mid: [d for (d,) in fresh(select(Payload.digest).where(
        Payload.message_id == mid))] for mid in (*old_ok, old_retrying, old_queued, young)}
    procs.worker()
    wait_until(lambda: all(status_of(m) == "delivered" for m in (*old_ok, young)), 60,
               "delivered")
    wait_until(lambda: status_of(old_retrying) == "retrying", 60, "retrying")
    age_all_files(store)
    at = (utcnow() - timedelta(minutes=1)).strftime("%H:%M")
    save_settings(session, DeliverySettings(cleanup_time=at))
    session.commit()

    procs.beat(extra_env={"B2BHUB_CLEANUP_TICK": "1"})
    wait_until(lambda: fresh(select(CleanupRun.state).where(
        CleanupRun.state == "finished")), 90, "a finished cleanup run")

    for mid in old_ok:
        assert status_of(mid) is None
        assert not any(store.exists(d) for d in files[mid])
    for mid in (old_retrying, old_queued, young):
        assert status_of(mid) is not None
        assert all(store.exists(d) for d in files[mid])
    [(state, trigger, removed)] = fresh(select(
        CleanupRun.state, CleanupRun.trigger, CleanupRun.messages_removed))
    assert (state, trigger, removed) == ("finished", "schedule", 3)
    time.sleep(3)  # more ticks: it ran once today
    assert len(fresh(select(CleanupRun.id))) == 1
    # the storage report is computed again after the run: the three messages kept
    [(kept,)] = fresh(select(Setting.value).where(Setting.key == "storage_report"))
    assert kept["messages"] == 3

    @app.before_request
    def forget_user() -> None:
        g.pop("_login_user", None)

    create_user(session, "ada", "correct horse battery", "viewer")
    session.commit()
    client = app.test_client()
    assert client.post("/ui/login", data={"name": "ada", "password":
                                          "correct horse battery"}).status_code == 302
    page = client.get("/ui/system/services").text
    assert 'id="cleanup-runs"' in page and "schedule" in page and "finished" in page
    assert f"nightly at {at} UTC" in page


def _bulk_messages(session, store, count: int, created_at, tag: str) -> list[int]:
    """``count`` delivered messages at ``created_at``, each with its own payload file,
    a delivery and three history lines, inserted in bulk (not through the intake)."""
    batch = store.batch()
    stored = [batch.put(f"{tag} {i}".encode()) for i in range(count)]
    batch.commit()
    first = (session.scalar(select(func.max(Message.id))) or 0) + 1
    ids = list(range(first, first + count))
    session.execute(insert(Message), [
        {"id": mid, "source": "inbox", "from_party": "acme", "to_party": "mycompany",
         "direction": "inbound", "size": s.size, "sha256": s.digest, "status": "delivered",
         "created_at": created_at, "updated_at": created_at}
        for mid, s in zip(ids, stored, strict=True)])
    session.execute(insert(Payload), [
        {"message_id": mid, "stage": "unpacked", "digest": s.digest, "size": s.size,
         "created_at": created_at} for mid, s in zip(ids, stored, strict=True)])
    session.execute(insert(Delivery), [
        {"message_id": mid, "target": "ok_t", "state": "delivered", "attempt": 1,
         "created_at": created_at, "updated_at": created_at} for mid in ids])
    session.execute(insert(HistoryLine), [
        {"message_id": mid, "type": kind, "text": kind, "created_at": created_at}
        for mid in ids for kind in ("received", "delivery_changed", "status_changed")])
    session.commit()
    return ids


def _check_whole(store) -> int:
    """Every message left has all its rows and its file; the number left."""
    per = {}
    for model, n in ((Payload, 1), (Delivery, 1), (HistoryLine, 3)):
        counts = dict(fresh(select(model.message_id, func.count()).where(
            model.message_id.is_not(None)).group_by(model.message_id)))
        per[model.__name__] = (counts, n)
    ids = [mid for (mid,) in fresh(select(Message.id))]
    for name, (counts, n) in per.items():
        assert all(counts.get(mid) == n for mid in ids), f"a half-deleted message ({name})"
        assert set(counts) <= set(ids), f"{name} rows of a deleted message"
    for (digest,) in fresh(select(Payload.digest)):
        assert store.exists(digest), "a file a kept row references was lost"
    return len(ids)


def test_kill_9_mid_cleanup_leaves_whole_messages_and_the_next_run_finishes(
        procs, hub, session, app):
    store = hub_module.store()
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("inbox", "manual_source")
    hub.instance("ok_t", "noop")
    now = utcnow()
    old = _bulk_messages(session, store, 3000, now - OLD, "old")
    young = _bulk_messages(session, store, 50, now, "young")
    age_all_files(store)
    young_files = [d for (d,) in fresh(select(Payload.digest).where(
        Payload.message_id.in_(young)))]
    rng = random.Random(18)
    kills = 0
    for _ in range(4):
        left_before = _check_whole(store)
        if left_before == len(young):
            break
        cli = subprocess.Popen([str(BIN / "b2bhub"), "cleanup", "--batch", "5"], cwd=ROOT,
                               env=procs.env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda b=left_before, p=cli: len(fresh(select(Message.id))) < b
                       or p.poll() is not None, 60, "the cleanup removing", every=0.02)
            time.sleep(rng.uniform(0, 0.2))
        finally:
            if cli.poll() is None:
                os.kill(cli.pid, signal.SIGKILL)
                kills += 1
            cli.wait(10)
        assert _check_whole(store) <= left_before
    assert kills >= 2, "the cleanup finished before it could be killed"
    done = procs.cli("cleanup")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _check_whole(store) == len(young)
    assert all(store.exists(d) for d in young_files)
    held = {d for (d,) in fresh(select(Payload.digest))}
    assert set(digests_in(store)) == held  # no file of a removed message is left
    states = [s for (s,) in fresh(select(CleanupRun.state).order_by(CleanupRun.id))]
    assert states[-1] == "finished" and states.count("interrupted") == kills
    assert sum(n for (n,) in fresh(select(CleanupRun.messages_removed))) == len(old)
    dry = procs.cli("cleanup", "--dry-run")
    assert "would remove 0 messages" in dry.stdout
