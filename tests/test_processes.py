"""The hub as it runs: real ``celery worker``, ``celery beat`` and gunicorn processes
on the backend under test, sharing its database and broker with the test process.

The test process stores messages with the engine and reads the outcome from the
database and from the recorder's attempt files; the workers do the deliveries.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.config.extensions import db
from b2bhub.engine import wakeups as wakeup_module
from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.models import Delivery, HistoryLine, Message, PluginInstance, utcnow
from b2bhub.runtime.hub import CeleryPublisher
from b2bhub.services import config as svc
from tests.procs import Processes, wait_until

pytestmark = pytest.mark.processes


@pytest.fixture
def procs(backend, app, tmp_path):
    """Processes on the test backend, every one stopped at the end of the test; the
    broker's queues start empty, so only what a test publishes wakes a worker."""
    app.extensions["celery"].control.purge()
    processes = Processes(backend, tmp_path, app.config["PAYLOAD_DIR"])
    yield processes
    processes.stop_all()


@pytest.fixture
def to_broker(app):
    """Wake-ups go to the real broker (instead of the ``wakeups`` list)."""
    wakeup_module.set_publisher(CeleryPublisher(app).publish)


# --- helpers ---------------------------------------------------------------------------

def rows(stmt):
    """Run a query in a fresh session (never a stale snapshot)."""
    with Session(db.engine) as s:
        return s.execute(stmt).all()


def state_counts(target: str) -> dict[str, int]:
    return dict(rows(select(Delivery.state, func.count()).where(Delivery.target == target)
                     .group_by(Delivery.state)))


def all_delivered(target: str, n: int) -> Callable[[], bool]:
    return lambda: state_counts(target).get("delivered", 0) == n


def history(delivery_id: int) -> list[str]:
    return [r[0] for r in rows(select(HistoryLine.text).where(
        HistoryLine.delivery_id == delivery_id).order_by(HistoryLine.id))]


def attempts(record_dir: Path) -> list[dict]:
    """Every attempt the recorder finished, from every process's file."""
    out = []
    for path in sorted(record_dir.glob("attempts-*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line]
    return out


def peak_overlap(records: list[dict]) -> int:
    """The most [start, end] intervals open at one instant (an end before a start
    at the same instant)."""
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def setup_recorder(hub, record_dir: Path, **fields) -> PluginInstance:
    """Parties, an ``inbox`` source, a ``recorder`` target and the route between them."""
    config = {"record_dir": str(record_dir), **fields.pop("config", {})}
    hub.parties()
    hub.instance("inbox", "manual_source")
    row = hub.instance("recorder", "recorder", config=config, **fields)
    hub.route("inbox", "*", "*", "recorder")
    return row


def reconfigure(session, registry, name: str, **config) -> None:
    """Change an instance's configuration; workers rebuild the plugin on its next use."""
    row = svc.get_instance(session, name)
    svc.save_instance(session, registry, {"config": {**row.config, **config}}, existing=row)
    session.commit()


def dispatch_many(hub, session, n: int, per_transaction: int = 500) -> None:
    """Store ``n`` messages for ``inbox`` in a few big transactions."""
    stored = hub.store.put(b"ISA*00*concurrency~")
    for i in range(n):
        store_and_dispatch(session, NewMessage(
            source="inbox", from_party="acme", to_party="mycompany",
            stages={"unpacked": (stored.digest, stored.size)}, external_id=f"m{i}"),
            utcnow())
        if (i + 1) % per_transaction == 0:
            session.commit()
    session.commit()


def delivery_of(message_id: int) -> Delivery:
    with Session(db.engine) as s:
        return s.scalars(select(Delivery).where(Delivery.message_id == message_id)).one()


# --- tests -----------------------------------------------------------------------------

def test_four_workers_share_deliveries_without_passing_max_concurrent(
        procs, hub, session, record_dir, to_broker):
    n = 2000
    setup_recorder(hub, record_dir, max_concurrent_deliveries=3,
                   config={"sleep": 0.003})
    workers = [procs.worker(wait=False) for _ in range(4)]
    for worker in workers:
        worker.wait_in_log(" ready.", timeout=60)

    dispatch_many(hub, session, n)
    wait_until(all_delivered("recorder", n), 180, f"all {n} delivered")

    records = attempts(record_dir)
    keys = Counter((r["delivery"], r["attempt"]) for r in records)
    assert len(records) == n and set(keys.values()) == {1}, "an attempt ran twice"
    assert len({r["delivery"] for r in records}) == n
    assert len({r["pid"] for r in records}) > 1, "one process did all the work"
    assert {r["pid"] for r in records} <= {w.pid for w in workers}
    peak = peak_overlap(records)
    assert 2 <= peak <= 3, f"peak of concurrent attempts {peak}"
    assert rows(select(Delivery.state, Delivery.attempt, func.count())
                .group_by(Delivery.state, Delivery.attempt)) == [("delivered", 1, n)]


def test_kill_9_mid_attempt_comes_back_after_the_lease_and_is_delivered(
        procs, hub, session, registry, record_dir, to_broker):
    save_settings(session, DeliverySettings(lease_seconds=3))
    setup_recorder(hub, record_dir, config={"sleep": 30})
    first = procs.worker()
    message = hub.message()
    wait_until(lambda: delivery_of(message.id).state == "in_progress", 30, "claimed")
    time.sleep(0.5)  # inside the recorder's sleep

    first.signal(signal.SIGKILL)
    assert first.wait_exit(10) == -signal.SIGKILL
    reconfigure(session, registry, "recorder", sleep=0)
    second = procs.worker()
    procs.beat()

    wait_until(lambda: delivery_of(message.id).state == "delivered", 40, "delivered")
    delivery = delivery_of(message.id)
    assert delivery.attempt == 2
    lines = history(delivery.id)
    assert "recorder: attempt 1 interrupted: lease expired" in lines
    assert lines.index("recorder: attempt 1 interrupted: lease expired") < \
        lines.index("recorder: attempt 2 started")
    assert lines[-1].startswith("recorder: attempt 2 delivered")
    assert [(r["attempt"], r["pid"]) for r in attempts(record_dir)] == [(2, second.pid)]


def test_sigterm_mid_attempt_fails_nothing_and_a_new_worker_delivers(
        procs, hub, session, registry, record_dir, to_broker):
    setup_recorder(hub, record_dir, config={"sleep": 30, "claim_batch": 4},
                   max_concurrent_deliveries=4, retry_policy={"base_delay": 1})
    worker = procs.worker(extra_env={"B2BHUB_STOP_GRACE": "1"})
    stored = hub.store.put(b"ISA*00*sigterm~")
    ids = [store_and_dispatch(session, NewMessage(
        source="inbox", from_party="acme", to_party="mycompany",
        stages={"unpacked": (stored.digest, stored.size)}), utcnow()).id for _ in range(4)]
    session.commit()  # one transaction: the worker claims all four in one batch
    wait_until(lambda: state_counts("recorder") == {"in_progress": 4}, 30, "claimed")
    time.sleep(0.5)

    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(10) is not None, "the worker did not stop after SIGTERM"
    assert time.monotonic() - started < 8

    after_stop = {m: delivery_of(m) for m in ids}
    assert sorted(d.state for d in after_stop.values()) == [
        "queued", "queued", "queued", "retrying"]
    for d in after_stop.values():
        last = history(d.id)[-1]
        if d.state == "retrying":
            assert last == "recorder: attempt 1 interrupted: worker stopping; retrying"
        else:
            assert last == ("recorder: attempt 1 interrupted: worker stopping before the "
                            "attempt")
    assert attempts(record_dir) == []

    reconfigure(session, registry, "recorder", sleep=0)
    procs.worker()
    procs.beat()
    wait_until(all_delivered("recorder", 4), 30, "all delivered")
    every_line = [line for m in ids for line in history(delivery_of(m).id)]
    assert not [line for line in every_line if "failed" in line]


def test_sigterm_mid_settlement_lets_the_settlement_commit_whole_and_the_worker_exit(
        procs, hub, session, record_dir, to_broker):
    """SPEC 5 "Stopping": a SIGTERM whose grace period runs out while the outcome of an
    attempt is being settled (its rows written, not yet committed) cancels nothing: the
    settlement commits whole (state and history agree), and the worker exits cleanly."""
    setup_recorder(hub, record_dir)
    worker = procs.worker(extra_env={"B2BHUB_STOP_GRACE": "0.5",
                                     "B2BHUB_FAULT_PAUSE": "settling:4"})
    message = hub.message()
    worker.wait_in_log("fault pause at settling", timeout=30)
    assert delivery_of(message.id).state == "in_progress"  # not committed yet

    worker.signal(signal.SIGTERM)  # the grace (0.5 s) ends inside the 4 s pause
    assert worker.wait_exit(20) == 0, worker.output()[-4000:]

    delivery = delivery_of(message.id)
    assert (delivery.state, delivery.attempt, delivery.lease_owner) == ("delivered", 1, None)
    assert delivery.settled_at is not None
    lines = history(delivery.id)
    assert lines[-1].startswith("recorder: attempt 1 delivered"), lines
    assert not [line for line in lines if "interrupted" in line or "failed" in line], lines
    assert [line for line in lines if "attempt 1 delivered" in line] == [lines[-1]]
    assert rows(select(Message.status).where(Message.id == message.id)) == [("delivered",)]
    assert [r["attempt"] for r in attempts(record_dir)] == [1]
    output = worker.output()
    assert "AttemptCancelled" not in output and "Traceback" not in output, output[-4000:]


def test_route_saved_in_the_web_process_applies_to_the_next_dispatch_in_a_worker(
        procs, app, hub, session, record_dir, to_broker):
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("recorder", "recorder", config={"record_dir": str(record_dir)})
    procs.worker(include="b2bhub_testplugins")
    web = procs.web()
    celery = app.extensions["celery"]

    def dispatch_in_worker(external_id: str) -> int:
        celery.send_task("tests.dispatch", args=["inbox", "acme", "mycompany",
                                                 f"body {external_id}", external_id])
        return wait_until(lambda: rows(select(Message.id, Message.status).where(
            Message.external_id == external_id)), 30, f"{external_id} stored")[0]

    first_id, status = dispatch_in_worker("before-route")
    assert status == "not_routed"

    create_route(procs, web, session, app, "inbox", "recorder")

    second_id, _ = dispatch_in_worker("after-route")
    wait_until(lambda: delivery_of(second_id).state == "delivered", 30, "delivered")
    assert rows(select(Delivery.id).where(Delivery.message_id == first_id)) == []


def create_route(procs: Processes, web, session, app, source: str, target: str) -> None:
    """Through the web process's API when it has ``POST /api/v1/routes``; until then
    with ``b2bhub fixtures load`` in a process of its own."""
    if _has_route_api(app):
        import requests

        from b2bhub.services.tokens import create_token
        token = create_token(session, "procs", "admin")
        session.commit()
        resp = requests.post(f"{web.url}/api/v1/routes", timeout=10,
                             headers={"Authorization": f"Bearer {token}"},
                             json={"source": source, "from": "*", "to": "*",
                                   "target": target})
        assert resp.status_code in (200, 201), resp.text
        return
    path = procs.tmp / "route.json"
    path.write_text(json.dumps({"routes": [{"source": source, "target": target}]}))
    done = procs.cli("fixtures", "load", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def _has_route_api(app) -> bool:
    return any(rule.rule == "/api/v1/routes" and "POST" in (rule.methods or ())
               for rule in app.url_map.iter_rules())


def test_a_starting_worker_takes_up_due_deliveries_at_once(
        procs, hub, session, record_dir, wakeups):
    setup_recorder(hub, record_dir)
    ids = [hub.message(external_id=f"m{i}").id for i in range(5)]
    assert len(wakeups) == 5  # recorded, never published: the broker queue is empty

    worker = procs.worker()
    ready = time.monotonic()
    wait_until(all_delivered("recorder", 5), 5, "delivered after the worker started")
    assert time.monotonic() - ready < 5  # the sweep's first re-wake would be at +10 s
    assert {r["pid"] for r in attempts(record_dir)} == {worker.pid}
    assert sorted(r["delivery"] for r in attempts(record_dir)) == sorted(
        delivery_of(m).id for m in ids)


def test_a_lost_wakeup_is_delivered_once_beat_runs(procs, hub, session, record_dir,
                                                    wakeups):
    setup_recorder(hub, record_dir)
    procs.worker()
    dispatched = time.monotonic()
    message = hub.message()
    assert len(wakeups) == 1  # the wake-up is lost
    time.sleep(3)
    assert delivery_of(message.id).state == "queued"  # a running worker alone never sees it

    procs.beat()
    wait_until(lambda: delivery_of(message.id).state == "delivered", 30, "delivered")
    waited = time.monotonic() - dispatched
    assert 9 <= waited < 25, f"delivered {waited:.1f} s after dispatch"
    assert [r["attempt"] for r in attempts(record_dir)] == [1]
