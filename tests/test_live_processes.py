"""Connected processes, their logs, and instance Start/Stop with real processes: a
``celery worker``, ``celery beat`` and gunicorn on the backend under test. The test
process only drops files, calls the REST API and reads the outcome."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
import requests
from sqlalchemy import select

from b2bhub.models import Delivery, Message, utcnow
from b2bhub.services.tokens import create_token
from tests.procs import wait_until
from tests.test_e2e_files import drop, left_in, load_fixtures, rows

pytestmark = pytest.mark.processes


@pytest.fixture
def admin(session):
    token = create_token(session, "live-tests", "admin")
    session.commit()
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {token}"
    return http


def test_a_worker_log_record_is_served_by_the_api_within_2_s(procs, app, admin):
    worker = procs.worker()
    web = procs.web()
    app.extensions["celery"].send_task(
        "b2bhub.deliver", args=["no-such-target"], queue="deliveries",
        routing_key="delivery.no-such-target")
    seen_at, found = None, None
    deadline = time.monotonic() + 10
    while found is None and time.monotonic() < deadline:
        page = admin.get(f"{web.url}/api/v1/logs", params={"process": "worker"}).json()
        found = next((r for r in page["items"] if "no-such-target" in r["message"]), None)
        seen_at = utcnow()
        time.sleep(0.05)
    assert found is not None, "the worker's record of the wake-up never came"
    assert found["pid"] == worker.pid and found["kind"] == "worker"
    assert found["level"] == "warning"
    assert found["message"] == ("no-such-target: woken, but no target instance has that "
                                "name; ignored")
    logged_at = datetime.fromisoformat(found["created_at"].rstrip("Z"))
    assert (seen_at - logged_at).total_seconds() < 2.0


def test_processes_register_and_instance_stop_takes_effect_in_the_worker(
        procs, tmp_path, admin):
    inbox, out = tmp_path / "in", tmp_path / "out"
    load_fixtures(procs, inbox, writer={"config": {
        "base_directory": str(out), "filename_pattern": "{to}/{original_filename}"}})
    worker = procs.worker()
    beat = procs.beat()
    web = procs.web()
    api = f"{web.url}/api/v1"

    drop(inbox, {"a.txt": b"first"})
    wait_until(lambda: left_in(out / "acme") == ["a.txt"], 30, "a.txt written")

    def processes() -> dict[int, dict]:
        return {p["pid"]: p for p in admin.get(f"{api}/processes").json()["items"]}

    wait_until(lambda: processes().get(worker.pid, {}).get("instances") == [
        "poller", "writer"], 15, "the worker reporting what it runs")
    listed = processes()
    assert {listed[p]["kind"] for p in (worker.pid, beat.pid)} == {"worker", "beat"}
    assert any(p["kind"] == "web" for p in listed.values())
    assert all(p["state"] == "running" for p in listed.values())

    # a stopped target: its delivery waits (not claimed, not stalled), the worker drops it
    stopped = admin.post(f"{api}/plugins/configs/writer/stop")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    drop(inbox, {"b.txt": b"second"})
    wait_until(lambda: rows(select(Delivery.state).join(Message).where(
        Message.original_filename == "b.txt")) == [("queued",)], 30, "b.txt taken in")
    wait_until(lambda: processes()[worker.pid]["instances"] == ["poller"], 15,
               "the worker no longer running the writer")

    # a stopped source: its files stay where they are
    assert admin.post(f"{api}/plugins/configs/poller/stop").status_code == 200
    time.sleep(1.5)  # a scan already published runs (and finds the instance stopped)
    drop(inbox, {"c.txt": b"third"})
    time.sleep(4)  # four polling intervals
    assert left_in(inbox / "acme") == ["c.txt"]
    assert left_in(out / "acme") == ["a.txt"]
    assert rows(select(Delivery.state).join(Message).where(
        Message.original_filename == "b.txt")) == [("queued",)]
    wait_until(lambda: processes()[worker.pid]["instances"] == [], 15,
               "the worker no longer running the poller")

    for name in ("writer", "poller"):
        started = admin.post(f"{api}/plugins/configs/{name}/start")
        assert started.status_code == 200 and started.json()["state"] == "enabled"
    wait_until(lambda: left_in(out / "acme") == ["a.txt", "b.txt", "c.txt"], 30,
               "b.txt and c.txt written after the start")
    assert (out / "acme" / "c.txt").read_bytes() == b"third"
    wait_until(lambda: processes()[worker.pid]["instances"] == ["poller", "writer"], 15,
               "the worker running both again")

    history = admin.get(f"{api}/events", params={"after": 0, "type": "instance_stopped"},
                        stream=True, timeout=5)
    first = next(block for block in history.iter_lines(decode_unicode=True, delimiter="\n\n")
                 if "event:" in block)
    history.close()
    assert "event: instance_stopped" in first and "live-tests stopped writer" in first

    worker.stop()
    wait_until(lambda: worker.pid not in processes(), 15, "the stopped worker leaving")
    everyone = {p["pid"]: p for p in admin.get(f"{api}/processes",
                                               params={"all": "true"}).json()["items"]}
    assert everyone[worker.pid]["state"] == "stopped"
