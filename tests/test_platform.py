"""Platform conventions (a Heroku-style platform hands its services to the app as
``DATABASE_URL``, ``REDIS_URL`` and ``PORT``): read when the ``B2BHUB_*`` variable is
not set, the ``B2BHUB_*`` one always winning; and the Procfile's ``web`` line serving on
the platform's port."""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.request
from urllib.parse import urlsplit

import pytest
import requests
from sqlalchemy.engine import make_url

from b2bhub.config import environment as config
from tests.conftest import BROKER_URL, IS_POSTGRES
from tests.procs import BIN, ROOT, Proc, Processes, free_port, wait_until

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


@pytest.mark.processes
@pytest.mark.postgres
@pytest.mark.skipif(not (IS_POSTGRES and BROKER_URL.startswith("redis")),
                    reason="the platform's variables name a PostgreSQL database and a Redis")
def test_the_platforms_three_variables_alone_run_the_procfiles_hub(
        backend, hub, session, registry, procs, tmp_path):
    """Web, worker and beat started by the Procfile's own lines with no ``B2BHUB_*``
    variable at all, only what a platform hands over: ``DATABASE_URL`` in its
    ``postgres://`` form, ``REDIS_URL`` and the web's ``PORT``. A document posted to the
    web is stored, woken through Redis and delivered by the worker, byte-identical; the
    data directory is the default one, in the app's directory."""
    from plugins.http_poster import HttpPoster
    from plugins.http_receiver import HttpReceiver
    from tests.http_peer import Peer
    from tests.test_http_receiver import set_up_receivers

    registry.register(HttpReceiver)
    registry.register(HttpPoster)
    destination = Peer()
    try:
        tokens = set_up_receivers(hub, session, destination.url("/in"), timeout=5,
                                  base_delay=1)
        url = make_url(backend["database_url"])
        database = url.set(drivername="postgres").render_as_string(hide_password=False)
        assert database.startswith("postgres://")
        app_dir = tmp_path / "app"  # the dyno's own directory, its disk
        app_dir.mkdir()
        base = {k: v for k, v in procs.env().items() if not k.startswith("B2BHUB_")}
        base |= {"DATABASE_URL": database, "REDIS_URL": backend["broker_url"],
                 "PYTHONPATH": str(ROOT), "WEB_CONCURRENCY": "1"}
        port = free_port()
        lines = dict(re.findall(r"^(\w+): (.+)$", (ROOT / "Procfile").read_text(), re.M))
        started = {}
        for kind in ("web", "worker", "beat"):
            cmd = lines[kind].split()
            env = {**base, "PORT": str(port)} if kind == "web" else base
            started[kind] = proc = Proc(kind, [str(BIN / cmd[0]), *cmd[1:]], env,
                                        tmp_path / f"{kind}.log", cwd=app_dir)
            procs.procs.append(proc)
        started["web"].wait_for(lambda: _health(port) is not None, 60,
                                f"serving on port {port}")
        started["worker"].wait_in_log("ready", 60)
        broker = urlsplit(backend["broker_url"])
        assert f"Connected to redis://:**@{broker.hostname}:{broker.port}{broker.path}" \
            in started["worker"].output()  # the platform's Redis, not the embedded broker
        body = os.urandom(5000)
        answer = requests.post(f"http://127.0.0.1:{port}/in/inbox", data=body,
                               headers={"Authorization": f"Bearer {tokens['inbox']}"},
                               timeout=30)
        assert answer.status_code == 202, answer.text
        wait_until(lambda: len(destination.seen) == 1, 60, "delivered by the worker")
        assert destination.seen[0].sha256 == hashlib.sha256(body).hexdigest()
        assert all(proc.alive() for proc in started.values())
        assert (app_dir / "var" / "secret_key").is_file()  # the default data directory
        assert not (app_dir / "var" / "broker.sqlite").exists()
        assert not (app_dir / "var" / "b2bhub.sqlite").exists()
        assert [p for p in (app_dir / "var" / "payloads").rglob("*")
                if p.is_file() and len(p.name) == 64]  # the payload store there too
    finally:
        procs.stop_all()
        destination.close()


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
