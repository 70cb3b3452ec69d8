"""``b2bhub fixtures load FILE`` (SPEC: command line): everything or nothing."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from b2bhub.cli import main
from b2bhub.config.extensions import db
from b2bhub.models import Party, PluginInstance, Route
from b2bhub.services import config as svc
from tests.enginekit import T0, deliveries

GOOD = {
    "organizations": [{"name": "mycompany", "display_name": "My Company"}],
    "partners": [{"name": "acme"}, {"name": "globex"}],
    "plugins": [
        {"name": "inbox", "type": "manual_source"},
        {"name": "writer_a", "type": "noop", "max_concurrent_deliveries": 2,
         "retry_policy": {"strategy": "fixed", "base_delay": 60, "max_attempts": 3}},
        {"name": "writer_b", "type": "noop", "enabled": True},
    ],
    "routes": [
        {"source": "inbox", "from": "*", "to": "*", "target": "writer_a"},
        {"source": "inbox", "from": "acme", "to": "mycompany", "target": "writer_b"},
    ],
}


def _load(app, tmp_path, data: dict):
    path = tmp_path / "fixtures.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return app.test_cli_runner().invoke(main, ["fixtures", "load", str(path)])


def _counts() -> tuple[int, int, int]:
    """Parties, instances and routes as committed (read on a connection of its own)."""
    with Session(db.engine) as other:
        return tuple(other.scalar(select(func.count()).select_from(model))
                     for model in (Party, PluginInstance, Route))


def test_fixtures_load_creates_parties_plugins_and_routes(app, tmp_path, session, hub):
    result = _load(app, tmp_path, GOOD)

    assert result.exit_code == 0, result.output
    assert result.output.strip() == "1 organizations, 2 partners, 3 plugins, 2 routes"
    assert _counts() == (3, 3, 2)
    writer = svc.get_instance(session, "writer_a")
    assert (writer.type, writer.max_concurrent_deliveries) == ("noop", 2)
    assert writer.retry_policy == {"strategy": "fixed", "base_delay": 60, "max_attempts": 3}
    assert svc.get_party(session, "organization", "mycompany").display_name == "My Company"
    routed = svc.test_route(session, "inbox", "acme", "mycompany")["targets"]
    assert routed == ["writer_a", "writer_b"]
    sent = hub.message(now=T0)  # the loaded routes apply to the next dispatch
    assert [d.target for d in deliveries(session, sent.id)] == ["writer_a", "writer_b"]


@pytest.mark.parametrize("change, error", [
    (lambda d: d["plugins"].append({"name": "sender", "type": "as5_sender"}),
     "unknown plugin type 'as5_sender'"),
    (lambda d: d["routes"].append({"source": "inbox", "from": "acme", "to": "*",
                                   "target": "writer_a"}),
     "redundant with route"),
    (lambda d: d["routes"].append({"source": "inbox", "from": "initech",
                                   "target": "writer_b"}),
     "from: no party named 'initech'"),
    (lambda d: d["routes"].append({"from": "acme", "target": "writer_b"}),
     "route 3: missing 'source'"),
])
def test_a_bad_fixture_gives_a_clear_error_and_creates_nothing(app, tmp_path, session,
                                                               hub, change, error):
    data = json.loads(json.dumps(GOOD))
    change(data)

    result = _load(app, tmp_path, data)

    assert result.exit_code != 0
    assert "nothing was loaded" in result.output
    assert error in result.output
    assert "Traceback" not in result.output
    assert _counts() == (0, 0, 0)
    # this process keeps working, and the routes it saw in the failed load are gone
    session.rollback()
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("writer_b", "noop")
    hub.route("inbox", "*", "*", "writer_b")
    sent = hub.message(now=T0)
    assert [d.target for d in deliveries(session, sent.id)] == ["writer_b"]


def test_a_fixture_file_that_is_not_json_is_refused_clearly(app, tmp_path):
    path = tmp_path / "fixtures.json"
    path.write_text("{organizations: [", encoding="utf-8")
    result = app.test_cli_runner().invoke(main, ["fixtures", "load", str(path)])
    assert result.exit_code != 0
    assert "not valid JSON" in result.output
    assert _counts() == (0, 0, 0)


def test_a_refused_entry_is_named_by_its_place_and_name(app, tmp_path):
    data = {"plugins": [{"name": "inbox", "type": "manual_source"},
                        {"name": "outbox", "type": "as5_sender"}]}
    result = _load(app, tmp_path, data)
    assert result.exit_code != 0
    assert "plugin 2 (outbox): unknown plugin type 'as5_sender'" in result.output
    assert "nothing was loaded" in result.output
