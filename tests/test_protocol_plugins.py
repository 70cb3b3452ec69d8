"""Protocols as plugins (SPEC 3): a third party's package adds a protocol with an
endpoint, a party profile kind, a periodic job and a table of its own, with no change to
b2bhub; a broken plugin package is logged and skipped and the hub still starts; the core
names no protocol.

The third party is ``tests/plugin_pkgs/b2bhub_echo``, installed by the Makefile as any
package is (``pip install <dir>``), registered only by its own ``pyproject.toml``.
"""

from __future__ import annotations

import ast
import importlib
import logging
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text

from b2bhub import create_app
from b2bhub.models import Delivery, Message
from b2bhub.plugin import PeriodicJob, Plugin
from b2bhub.plugin.registry import PluginRegistry, plugin_problem
from tests import test_ui
from tests.conftest import _config

ROOT = Path(__file__).resolve().parent.parent
login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request


def _installed_echo() -> type:
    """The echo type as the entry points of the installed package name it."""
    found = PluginRegistry()
    found.load()
    assert "echo_intake" in found, found.failures or "b2bhub-echo is not installed (make install)"
    return found.get("echo_intake")


@pytest.fixture
def registry(registry):
    """The test plugins and the installed echo protocol, before the app is made (its
    jobs are scheduled from the registry when Celery is set up)."""
    registry.register(_installed_echo())
    return registry


@pytest.fixture
def echo(hub, api):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("rec", "noop")
    hub.instance("echo1", "echo_intake", config={"max_size": 1000})
    hub.route("echo1", "*", "*", "rec")
    answer = api.put("/api/v1/partners/acme/profiles/echo",
                     json={"echo_id": "ACME", "secret": "s3cret"})
    assert answer.status_code == 200, answer.text
    return answer


def post(client, body: bytes, instance="echo1", secret="s3cret", **headers):
    return client.post(f"/echo/{instance}", data=body, headers={
        "Echo-From": "ACME", "Echo-Secret": secret, "Echo-To": "mycompany", **headers})


def test_the_echo_package_is_found_by_its_own_entry_point():
    cls = _installed_echo()
    assert cls.__module__ == "b2bhub_echo.plugin"
    assert "site-packages" in sys.modules[cls.__module__].__file__  # installed, not ours


def test_a_third_party_endpoint_stores_and_routes_a_message(echo, client, session):
    answer = post(client, b"hello partner")
    assert answer.status_code == 200, answer.text
    assert answer.data == b"hello partner"
    message = session.get(Message, int(answer.headers["Echo-Message"]))
    assert (message.source, message.from_party, message.to_party) == (
        "echo1", "acme", "mycompany")
    assert [d.target for d in session.scalars(
        select(Delivery).where(Delivery.message_id == message.id))] == ["rec"]
    # the row in the plugin's own table, made by its own migration
    row = session.execute(text("SELECT instance, echo_id FROM echo_receipts "
                               "WHERE message_id = :m"), {"m": message.id}).one()
    assert tuple(row) == ("echo1", "ACME")


def test_the_core_refuses_for_the_endpoint_as_for_any(echo, client, session):
    """A missing instance, a body over its max_size, a wrong secret: nothing stored."""
    missing = post(client, b"x", instance="nope")
    assert missing.status_code == 404
    assert missing.text == "no enabled echo intake named 'nope'\n"
    too_big = post(client, b"x" * 1001)
    assert too_big.status_code == 413 and "1000 bytes" in too_big.text
    assert post(client, b"x", secret="guess").status_code == 403
    assert session.scalar(select(Message.id)) is None
    # no login and no CSRF token are asked for; other URLs keep their answers
    assert client.post("/nothere/echo1").status_code == 404
    assert client.post("/ui/parties").status_code == 405


def test_a_third_party_profile_kind_keeps_its_secret(echo, api, login):
    assert "s3cret" not in echo.text and echo.json["has_secret"] is True
    shown = api.get("/api/v1/partners/acme/profiles/echo")
    assert shown.json == {"party": "acme", "kind": "partner", "echo_id": "ACME",
                          "has_secret": True}
    refused = api.put("/api/v1/partners/acme/profiles/echo", json={"colour": "red"})
    assert refused.status_code == 400 and "colour" in refused.text
    assert api.get("/api/v1/partners/acme/profiles/none").status_code == 404
    admin = login("admin", "ada")
    parties = admin.get("/ui/parties").text
    assert "<th>Echo</th>" in parties and ">ACME</a>" in parties
    page = admin.get("/ui/parties/partner/acme/echo").text
    assert "Echo profile of partner acme" in page and "ACME" in page
    assert "s3cret" not in page
    saved = admin.post("/ui/parties/partner/acme/echo", data={"echo_id": "ACME2",
                                                              "secret": ""})
    assert saved.status_code == 302, saved.text
    assert api.get("/api/v1/partners/acme/profiles/echo").json["has_secret"] is True
    assert api.delete("/api/v1/partners/acme/profiles/echo").status_code == 204
    assert api.get("/api/v1/partners/acme/profiles/echo").status_code == 404
    # removing it again is no error (the party has none, as asked); no such party is
    assert api.delete("/api/v1/partners/acme/profiles/echo").status_code == 204
    assert api.delete("/api/v1/partners/nosuch/profiles/echo").status_code == 404


def test_a_third_party_job_is_scheduled_by_beat_and_runs(echo, app, client, session):
    assert post(client, b"one").status_code == 200
    schedule = app.extensions["celery"].conf.beat_schedule
    assert schedule["echo_tally"]["task"] == "b2bhub.plugin_job"
    assert schedule["echo_tally"]["schedule"] == 60.0
    assert schedule["echo_tally"]["args"] == ["echo_tally"]
    assert "sweep" in schedule  # the core's own jobs stay
    from b2bhub.runtime.tasks import plugin_job
    assert plugin_job.run("echo_tally") == 1  # the task beat starts, run here
    session.rollback()
    assert session.execute(text("SELECT count(*) FROM echo_receipts "
                                "WHERE tallied_at IS NOT NULL")).scalar() == 1


def test_plugin_migrations_are_a_branch_of_their_own(app, db):
    tables = inspect(db.engine).get_table_names()
    assert "echo_receipts" in tables
    with db.engine.connect() as conn:
        heads = {r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))}
    assert "e001_echo_receipts" in heads


BROKEN = "[b2bhub.plugins]\nbroken_proto = b2bhub_broken_proto:Broken\n"


def test_a_broken_plugin_package_is_logged_and_skipped(backend, tmp_path, caplog):
    """An entry point whose module fails to import: the other types load, the app starts
    and serves the other protocols' endpoints."""
    dist = tmp_path / "dist"
    (dist / "b2bhub_broken_proto-1.0.dist-info").mkdir(parents=True)
    (dist / "b2bhub_broken_proto-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: b2bhub-broken-proto\nVersion: 1.0\n")
    (dist / "b2bhub_broken_proto-1.0.dist-info" / "entry_points.txt").write_text(BROKEN)
    (dist / "b2bhub_broken_proto.py").write_text("raise ImportError('half installed')\n")
    sys.path.insert(0, str(dist))
    importlib.invalidate_caches()
    try:
        found = PluginRegistry()
        with caplog.at_level(logging.ERROR, logger="b2bhub.plugins"):
            found.load()
    finally:
        sys.path.remove(str(dist))
        importlib.invalidate_caches()
    assert "half installed" in found.failures["broken_proto"]
    assert any("broken_proto" in r.getMessage() for r in caplog.records)
    assert {"echo_intake", "as2_receiver", "as2_sender"} <= set(found.types())
    app = create_app(_config(backend, PLUGIN_REGISTRY=found,
                             PAYLOAD_DIR=str(tmp_path / "payloads")))
    with app.app_context():
        client = app.test_client()
        assert client.get("/ui/login").status_code == 200
        assert client.post("/echo/none", data=b"x").status_code == 404
    assert "echo_tally" in app.extensions["celery"].conf.beat_schedule


def test_the_core_names_no_protocol():
    """No code of ``b2bhub/`` names AS2 (prose may: docstrings and comments); the Celery
    settings name none at all."""
    named = []
    for path in sorted((ROOT / "b2bhub").rglob("*.py")):
        tree = ast.parse(path.read_text())
        prose = {id(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
        for node in ast.walk(tree):
            words = []
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in prose:
                words = [node.value]
            elif isinstance(node, ast.Name):
                words = [node.id]
            elif isinstance(node, ast.Attribute):
                words = [node.attr]
            elif isinstance(node, ast.alias):
                words = [node.name]
            elif isinstance(node, ast.ImportFrom):
                words = [node.module or ""]
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                words = [node.name]
            named += [f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}: {w}"
                      for w in words if "as2" in w.lower()]
    assert named == []
    assert "as2" not in (ROOT / "celeryconfig.py").read_text().lower()


@pytest.mark.parametrize("hooks, problem", [
    ({"endpoint_prefix": "a/b"}, "endpoint_prefix"),
    ({"periodic_jobs": (PeriodicJob("j", print),)}, "every (seconds) or at"),
    ({"periodic_jobs": (PeriodicJob("j", print, every=5, at="03:00"),)}, "not both"),
    ({"periodic_jobs": (PeriodicJob("j", print, at="25:00"),)}, "HH:MM"),
    ({"migrations": "/nonexistent/versions"}, "not a directory"),
])
def test_a_type_with_broken_hooks_is_refused_by_the_registry(hooks, problem):
    """Skipped at load like one that fails to import, so beat and the app still start."""
    cls = type("BadProto", (Plugin,), {"type_name": "bad_proto",
                                       "roles": frozenset({"source"}), **hooks})
    assert problem in plugin_problem(cls)
