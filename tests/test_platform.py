"""Platform conventions (a Heroku-style platform hands its services to the app as
``DATABASE_URL``, ``REDIS_URL`` and ``PORT``): read when the ``B2BHUB_*`` variable is
not set, the ``B2BHUB_*`` one always winning; and the Procfile's ``web`` line serving on
the platform's port."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from sqlalchemy.engine import make_url

from b2bhub import config
from tests.procs import BIN, ROOT, Proc, Processes, free_port

PLATFORM = ("DATABASE_URL", "REDIS_URL", "PORT", "B2BHUB_DATABASE_URL", "B2BHUB_BROKER_URL",
            "B2BHUB_HOST", "B2BHUB_PORT")


@pytest.fixture
def env(monkeypatch):
    for name in PLATFORM:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("given, used", [
    ("postgres://u:p@db.example:5432/hub", "postgresql+psycopg://u:p@db.example:5432/hub"),
    ("postgresql://u@db.example/hub", "postgresql+psycopg://u@db.example/hub"),
    ("postgresql+psycopg://u@db.example/hub", "postgresql+psycopg://u@db.example/hub"),
    ("sqlite:////srv/hub.sqlite", "sqlite:////srv/hub.sqlite"),
])
def test_the_platforms_database_url_gets_the_installed_driver(env, tmp_path, given, used):
    env.setenv("DATABASE_URL", given)
    assert config.load({"DATA_DIR": str(tmp_path)})["SQLALCHEMY_DATABASE_URI"] == used


def test_b2bhub_variables_win_over_the_platforms(env, tmp_path):
    env.setenv("DATABASE_URL", "postgres://platform/db")
    env.setenv("REDIS_URL", "redis://platform:6379/0")
    env.setenv("PORT", "5000")
    env.setenv("B2BHUB_DATABASE_URL", "postgresql://own/db")
    env.setenv("B2BHUB_BROKER_URL", "redis://own:6379/1")
    env.setenv("B2BHUB_HOST", "127.0.0.2")
    env.setenv("B2BHUB_PORT", "8100")
    cfg = config.load({"DATA_DIR": str(tmp_path)})
    assert cfg["SQLALCHEMY_DATABASE_URI"] == "postgresql+psycopg://own/db"
    assert cfg["BROKER_URL"] == "redis://own:6379/1"
    assert (cfg["HOST"], cfg["PORT"]) == ("127.0.0.2", 8100)


def test_without_any_variable_the_embedded_default_on_loopback(env, tmp_path):
    cfg = config.load({"DATA_DIR": str(tmp_path)})
    assert cfg["SQLALCHEMY_DATABASE_URI"] == f"sqlite:///{tmp_path / 'b2bhub.sqlite'}"
    assert cfg["BROKER_URL"] == f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}"
    assert (cfg["HOST"], cfg["PORT"]) == ("127.0.0.1", 8000)


def test_the_platforms_redis_and_port(env, tmp_path):
    env.setenv("REDIS_URL", "redis://platform:6379/0")
    env.setenv("PORT", "5000")
    cfg = config.load({"DATA_DIR": str(tmp_path)})
    assert cfg["BROKER_URL"] == "redis://platform:6379/0"
    assert (cfg["HOST"], cfg["PORT"]) == ("0.0.0.0", 5000)


def test_the_procfile_web_line_serves_on_the_platforms_port(backend, tmp_path):
    """The Procfile's own ``web`` command, run with nothing but the platform's variables
    for the database and the port (the database URL in the plain form a platform gives,
    on PostgreSQL), answers on that port."""
    web_line = re.search(r"^web: (.+)$", (ROOT / "Procfile").read_text(), re.M).group(1)
    assert "$" not in web_line, "the web line needs no shell to read the port"
    procs = Processes(backend, tmp_path)
    port = free_port()
    url = make_url(backend["database_url"])
    plain = url.set(drivername=url.drivername.split("+")[0]).render_as_string(
        hide_password=False)
    env = procs.env({"PORT": str(port), "DATABASE_URL": plain, "B2BHUB_WEB_THREADS": "8"})
    del env["B2BHUB_DATABASE_URL"]  # the platform's variable alone names the database
    cmd = [str(BIN / web_line.split()[0]), *web_line.split()[1:]]
    proc = Proc("web", cmd, env, tmp_path / "web.log")
    procs.procs.append(proc)
    try:
        proc.wait_for(lambda: _health(port) is not None, 60, f"serving on port {port}")
        health = _health(port)
        assert health == {"status": "ok", "database": url.get_backend_name()}
        assert f"0.0.0.0:{port}" in proc.output()
    finally:
        procs.stop_all()


def _health(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


def test_the_web_process_loads_its_brokers_transport_before_its_first_request(backend):
    """``wsgi.py`` (what gunicorn's workers import) loads the broker's transport and its
    client library at start, so the first intake's wake-up does not pay those imports
    inside a request (a few hundred milliseconds); nothing connects to the broker."""
    import os
    import subprocess

    from kombu import Connection

    module = type(Connection(backend["broker_url"]).transport).__module__
    probe = ("import sys; import wsgi; "
             f"print({module!r} in sys.modules, 'kombu.transport' in sys.modules)")
    env = {**os.environ, "B2BHUB_DATABASE_URL": backend["database_url"],
           "B2BHUB_BROKER_URL": backend["broker_url"], "B2BHUB_DATA_DIR": backend["data_dir"]}
    out = subprocess.run([str(BIN / "python"), "-c", probe], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"], (module, out.stdout, out.stderr[-2000:])
