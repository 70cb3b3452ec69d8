"""Stats, metrics, logs, processes and instance Start/Stop through the API, in process:
figures match what was created, validation errors, role checks."""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from b2bhub.engine.runner import TargetRunner
from b2bhub.engine.stats import sample_minutes
from b2bhub.models import HistoryLine, utcnow
from b2bhub.runtime.agent import Agent
from b2bhub.runtime.hub import new_session
from tests.test_api import error_of, token_client
from tests.test_events import read_events


@pytest.fixture
def flow(hub, registry, session):
    """3 messages delivered to ``out``; 2 due for ``later`` (never drained)."""
    hub.parties(organizations=("mycompany", "other"))
    hub.instance("inbox", "manual_source")
    hub.instance("out", "noop")
    hub.instance("later", "noop")
    hub.route("inbox", "acme", "mycompany", "out")
    hub.route("inbox", "acme", "other", "later")
    for _ in range(3):
        hub.message(to_party="mycompany")
    for _ in range(2):
        hub.message(to_party="other")
    TargetRunner(new_session, registry, hub.store, "test-owner").drain("out", 10)
    sample_minutes(session, utcnow() + timedelta(minutes=1))
    session.commit()


def metric_values(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_stats_count_what_was_created_and_delivered(api, flow):
    body = api.get("/api/v1/stats").get_json()
    assert body["messages"]["total"] == 5
    assert body["messages"]["by_status"]["delivered"] == 3
    assert body["deliveries"]["by_state"]["delivered"] == 3
    assert body["deliveries"]["by_state"]["queued"] == 2
    assert body["deliveries"]["due"] == 2
    assert body["deliveries"]["oldest_due_seconds"] >= 0
    assert {i["name"]: i["enabled"] for i in body["instances"]["items"]} == {
        "inbox": True, "later": True, "out": True}
    assert sum(body["instances"]["by_state"].values()) == 3
    points = body["series"]["points"]
    assert len(points) == 10  # the first sample catches up on the last 10 minutes
    point = points[-1]
    assert sum(p["messages_in"] for p in points) == 5
    assert (point["messages_in"], point["attempts"], point["delivered"],
            point["failures"]) == (5, 3, 3, 0)
    assert point["duration_avg_seconds"] >= 0 and point["due"] == 2
    assert body["attempts"]["last_hour"] == 3
    assert body["attempts"]["delivered_last_hour"] == 3
    assert api.get("/api/v1/stats?series=day").get_json()["series"]["points"] == points
    assert api.get("/api/v1/stats?series=none").get_json()["series"]["points"] == []
    error = error_of(api.get("/api/v1/stats?series=week"), 400, "invalid")
    assert error["details"] == {"series": "series must be hour, day or none"}


def test_metrics_are_prometheus_text_with_the_same_figures(api, flow):
    response = api.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    values = metric_values(response.get_data(as_text=True))
    assert values[("b2bhub_messages", (("status", "delivered"),))] == 3
    assert values[("b2bhub_deliveries", (("state", "queued"),))] == 2
    assert values[("b2bhub_deliveries_due", ())] == 2
    assert values[("b2bhub_oldest_due_delivery_seconds", ())] >= 0
    assert values[("b2bhub_attempts_last_minute", ())] == 3
    assert values[("b2bhub_delivered_last_minute", ())] == 3
    assert values[("b2bhub_messages_in_last_minute", ())] == 5
    assert values[("b2bhub_instance_state", (("instance", "out"), ("state", "enabled")))] == 1


def test_watching_calls_need_a_token_and_viewer_is_enough(app, session, client, flow):
    for path in ("/api/v1/stats", "/metrics", "/api/v1/processes", "/api/v1/logs"):
        error_of(client.get(path), 401, "unauthorized")
    viewer = token_client(app, session, "viewer")
    for path in ("/api/v1/stats", "/metrics", "/api/v1/processes", "/api/v1/logs"):
        assert viewer.get(path).status_code == 200, path


def test_stop_and_start_need_admin_and_leave_a_line_naming_the_operator(
        app, session, api, flow):
    operator = token_client(app, session, "operator")
    error_of(operator.post("/api/v1/plugins/configs/later/stop"), 403, "forbidden")
    error_of(api.post("/api/v1/plugins/configs/nothing/stop"), 404, "not_found")

    stopped = api.post("/api/v1/plugins/configs/later/stop")
    assert stopped.status_code == 200
    assert stopped.get_json() == {"name": "later", "state": "stopped",
                                  "state_reason": "stopped by tests",
                                  "message": "tests stopped later"}
    again = api.post("/api/v1/plugins/configs/later/stop").get_json()
    assert again["message"] == "tests: later was stopped already"
    started = api.post("/api/v1/plugins/configs/later/start").get_json()
    assert (started["state"], started["message"]) == ("enabled", "tests started later")
    lines = session.execute(db_lines()).all()
    assert lines == [("instance_stopped", "tests", "tests stopped later"),
                     ("instance_stopped", "tests", "tests: later was stopped already"),
                     ("instance_started", "tests", "tests started later")]

    api.put("/api/v1/plugins/configs/later", json={"enabled": False})
    error = error_of(api.post("/api/v1/plugins/configs/later/stop"), 409, "action_refused")
    assert "disabled" in error["message"]


def db_lines():
    from sqlalchemy import select
    return (select(HistoryLine.type, HistoryLine.actor, HistoryLine.text)
            .where(HistoryLine.message_id.is_(None)).order_by(HistoryLine.id))


def test_logs_above_the_stream_level_are_paged_newest_first(app, api):
    app.config["LOG_STREAM_LEVEL"] = "WARNING"
    agent = Agent(app, "web").start()
    log = logging.getLogger("b2bhub.tests.live")
    log.info("not kept: below the stream level")
    for i in range(3):
        log.warning("kept %d", i)
    log.error("broken", exc_info=ValueError("bad value"))
    agent.stop()

    page = api.get("/api/v1/logs?limit=2").get_json()
    assert [r["message"] for r in page["items"]][1] == "kept 2"
    assert page["items"][0]["message"] == "broken\nValueError: bad value"
    assert page["items"][0]["level"] == "error"
    assert {(r["kind"], r["pid"]) for r in page["items"]} == {("web", os.getpid())}
    rest = api.get(f"/api/v1/logs?limit=2&cursor={page['next_cursor']}").get_json()
    assert [r["message"] for r in rest["items"]] == ["kept 1", "kept 0"]
    mine = [r for r in api.get("/api/v1/logs?limit=50").get_json()["items"]
            if r["logger"] == "b2bhub.tests.live"]
    assert len(mine) == 4
    errors = api.get("/api/v1/logs?level=error&process=web").get_json()["items"]
    assert [r["message"].split("\n")[0] for r in errors] == ["broken"]
    assert api.get("/api/v1/logs?process=worker").get_json()["items"] == []
    error = error_of(api.get("/api/v1/logs?level=loud"), 400, "invalid")
    assert set(error["details"]) == {"level"}


def test_routine_task_records_stay_out_of_the_stream_but_their_warnings_do_not(app, api):
    app.config["LOG_STREAM_LEVEL"] = "INFO"
    agent = Agent(app, "worker").start()
    ours, trace = logging.getLogger("b2bhub.tests.live"), logging.getLogger("celery.app.trace")
    ours.setLevel(logging.INFO)
    trace.setLevel(logging.INFO)
    trace.info("Task b2bhub.schedule_sources succeeded in 0.001s")
    trace.warning("Task b2bhub.deliver raised unexpected: boom")
    ours.info("an info record of our own")
    agent.stop()
    messages = [r["message"] for r in api.get("/api/v1/logs?limit=50").get_json()["items"]]
    assert "Task b2bhub.deliver raised unexpected: boom" in messages
    assert "an info record of our own" in messages
    assert not any("succeeded in" in m for m in messages)


def test_a_process_is_listed_while_it_heartbeats_and_as_stopped_after(app, api):
    agent = Agent(app, "beat").start()
    [listed] = api.get("/api/v1/processes").get_json()["items"]
    assert (listed["kind"], listed["pid"], listed["state"]) == ("beat", os.getpid(),
                                                                 "running")
    agent.stop()
    assert api.get("/api/v1/processes").get_json()["items"] == []
    [gone] = api.get("/api/v1/processes?all=true").get_json()["items"]
    assert gone["state"] == "stopped" and gone["stopped_at"]
    error_of(api.get("/api/v1/processes?all=maybe"), 400, "invalid")


def test_log_records_stream_as_server_sent_events(app, api):
    app.config.update(STREAM_POLL_SECONDS=0.01, STREAM_KEEPALIVE_SECONDS=0.05)
    agent = Agent(app, "worker").start()
    try:
        stream = api.get("/api/v1/logs/stream?level=warning")
        log = logging.getLogger("b2bhub.tests.live")
        log.info("below the filter")
        log.warning("first warning")
        log.error("then an error")
        events = read_events(stream, 2)
    finally:
        agent.stop()
    assert [(kind, data["message"], data["kind"]) for _, kind, data in events] == [
        ("log", "first warning", "worker"), ("log", "then an error", "worker")]
    assert int(events[0][0]) < int(events[1][0]) == events[1][2]["id"]
    # each one the object the document names for the stream's events
    from openapi_schema_validator import OAS30Validator
    doc = api.get("/api/v1/openapi.json").get_json()
    content = doc["paths"]["/api/v1/logs/stream"]["get"]["responses"]["200"]["content"]
    ref = content["text/event-stream"]["schema"]["x-event-data"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    for _, _, data in events:
        OAS30Validator(schema).validate(data)
        assert set(data) == set(schema["properties"])


def test_a_log_level_that_does_not_exist_is_refused_with_its_name(app):
    from b2bhub.observability.logstream import stream_level
    assert stream_level({"LOG_STREAM_LEVEL": "debug", "LOG_LEVEL": "WARNING"}) == 30
    with pytest.raises(ValueError, match="B2BHUB_LOG_STREAM_LEVEL='loud' is not a log level"):
        stream_level({"LOG_STREAM_LEVEL": "loud", "LOG_LEVEL": "INFO"})
