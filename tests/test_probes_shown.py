"""Where a probe's result shows (SPEC 8, 14): the API instance shape, ``/stats``,
``/metrics``, System > Services, Plugins and the dashboard; and the instance's probe
interval as it is saved."""

from __future__ import annotations

from datetime import UTC

import pytest

from b2bhub.engine.probes import ProbeResult, record
from b2bhub.services.users import create_user
from tests import test_probes as kit
from tests.enginekit import T0
from tests.test_api import error_of
from tests.test_live_api import metric_values
from tests.test_ui import PASSWORD

registry, peer = kit.registry, kit.peer  # the fixtures of the probe tests
instance, setup_poster = kit.instance, kit.setup_poster


def test_the_probe_interval_of_an_instance_is_checked(api, hub, session, peer):
    setup_poster(hub, session, peer)
    config = instance().config
    error = error_of(api.put("/api/v1/plugins/configs/poster", json={
        "probe_interval": 3, "config": config}), 422)  # 0, or 5 and up: the hub says
    assert error["message"] == "probe_interval must be 0 (the System > Settings probe " \
                               "interval) or from 5 to 604800 seconds"
    assert instance().probe_interval == 0
    # a week at most: beyond, the column could not hold it on PostgreSQL
    error_of(api.put("/api/v1/plugins/configs/poster", json={
        "probe_interval": 7 * 86_400 + 1, "config": config}), 400)
    assert instance().probe_interval == 0
    assert api.put("/api/v1/plugins/configs/poster", json={
        "probe_interval": 30, "config": config}).get_json()["probe_interval"] == 30
    assert instance().probe_interval == 30


# --- where the result shows ---------------------------------------------------------

@pytest.fixture
def offline(hub, session, peer):
    """``poster`` probed offline at T0, ``plain`` never probed."""
    setup_poster(hub, session, peer)
    hub.instance("plain", "noop")
    record(session, "poster", ProbeResult(False, "the probe answered offline"), T0, T0)
    session.commit()


def test_the_api_instance_stats_and_metrics_show_the_last_probe(api, offline):
    shape = api.get("/api/v1/plugins/configs/poster").get_json()
    assert (shape["online"], shape["probe_checked_at"], shape["probe_text"]) == (
        False, "2030-01-07T09:00:00Z", "the probe answered offline")
    assert api.get("/api/v1/plugins/configs/plain").get_json()["online"] is None

    body = api.get("/api/v1/stats?series=none").get_json()["instances"]
    items = {i["name"]: i for i in body["items"]}
    assert (items["poster"]["online"], items["poster"]["probe_checked_at"]) == (
        False, "2030-01-07T09:00:00Z")
    assert (items["plain"]["online"], items["plain"]["probe_checked_at"]) == (None, None)
    assert body["offline"] == 1

    values = metric_values(api.get("/metrics").get_data(as_text=True))
    assert values[("b2bhub_target_online", (("instance", "poster"),))] == 0
    assert values[("b2bhub_target_last_probe_timestamp_seconds",
                   (("instance", "poster"),))] == T0.replace(tzinfo=UTC).timestamp()
    assert ("b2bhub_target_online", (("instance", "plain"),)) not in values


def test_services_plugins_and_dashboard_show_offline(app, session, offline):
    create_user(session, "viv", PASSWORD, "viewer")
    session.commit()
    client = app.test_client()
    assert client.post("/ui/login", data={"name": "viv", "password": PASSWORD}
                       ).status_code == 302
    services = client.get("/ui/system/services").text
    row = services.split('data-instance="poster"')[1].split("</tr>")[0]
    assert "Offline" in row and "2030-01-07 09:00:00" in row
    assert "the probe answered offline" in row
    plain = services.split('data-instance="plain"')[1].split("</tr>")[0]
    assert "Offline" not in plain and "Online" not in plain
    plugins = client.get("/ui/plugins").text
    assert "Offline" in plugins.split('data-instance="poster"')[1].split("</tr>")[0]
    assert "Offline" not in plugins.split('data-instance="plain"')[1].split("</tr>")[0]
    dashboard = client.get("/ui/").text
    states = dashboard.split('id="instance-states"')[1].split("</table>")[0]
    assert states.count("Offline") == 1


def test_the_instance_form_edits_the_probe_interval(app, hub, session, peer):
    setup_poster(hub, session, peer)
    create_user(session, "ada", PASSWORD, "admin")
    session.commit()
    client = app.test_client()
    client.post("/ui/login", data={"name": "ada", "password": PASSWORD})
    form = client.get("/ui/plugins/poster/edit").text
    assert 'name="probe_interval" type="text" value=""' in form  # 0: the setting's

    def save(interval: str):
        config = instance().config
        return client.post("/ui/plugins/poster/edit", data={
            "name": "poster", "enabled": "y", "config-url": config["url"],
            "config-probe_url": config["probe_url"], "config-timeout": "2",
            "max_concurrent_deliveries": "4", "retry_policy": "",
            "probe_interval": interval})

    assert save("30").status_code == 302
    assert instance().probe_interval == 30
    assert 'name="probe_interval" type="text" value="30"' in client.get(
        "/ui/plugins/poster/edit").text
    refused = save("3")
    assert refused.status_code == 400 and "or from 5 to 604800 seconds" in refused.text
    assert instance().probe_interval == 30
    assert save("").status_code == 302
    assert instance().probe_interval == 0
