"""Fixtures: ``app``, ``db``, ``session``, ``client``, ``api`` (a client with a token),
factories, and the backend under test.

The suite runs on the embedded default (SQLite, kombu's SQLAlchemy broker) unless
``B2BHUB_TEST_DATABASE_URL`` (a PostgreSQL URL; a database of its own is created for
the run) and ``B2BHUB_TEST_BROKER_URL`` (a Redis URL) say otherwise. The schema comes
from the migrations, once per run; each test starts from empty tables.

Tests never load installed entry points by accident: the registry they get has the
plugins they register. Wake-ups are recorded (``wakeups`` fixture) instead of published,
unless a test starts real processes.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIST = ROOT / "tests" / "plugin_dist"
sys.path.insert(0, str(PLUGIN_DIST))

import b2bhub_testplugins as testplugins  # noqa: E402

from b2bhub import create_app  # noqa: E402
from b2bhub.engine import wakeups as wakeup_module  # noqa: E402
from b2bhub.engine.dispatch import route_cache  # noqa: E402
from b2bhub.models import Base  # noqa: E402
from b2bhub.plugin.registry import PluginRegistry  # noqa: E402

PG_URL = os.environ.get("B2BHUB_TEST_DATABASE_URL", "")
IS_POSTGRES = PG_URL.startswith("postgresql")
# pytest-xdist's worker of this process ("gw0", "gw1", ...; empty without -n)
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _own_broker(url: str) -> str:
    """The Redis broker of this test process: under pytest-xdist (``make test`` runs the
    suite in two processes) each process gets a Redis database of its own, counting down
    from the one given (15, 14, ...), because the real workers a test starts would
    otherwise take the wake-ups another process's test published, for deliveries of a
    database they do not know. Each process's PostgreSQL database and embedded files are
    its own already (named by its pid, under its own temporary directory)."""
    if not url.startswith(("redis://", "rediss://")) or XDIST_WORKER in ("", "gw0"):
        return url
    parts = urlsplit(url)
    number = int(parts.path.strip("/") or 0) - int(XDIST_WORKER.removeprefix("gw"))
    return urlunsplit(parts._replace(path=f"/{number % 16}"))


BROKER_URL = _own_broker(os.environ.get("B2BHUB_TEST_BROKER_URL", ""))
#: whether BROKER_URL is a Redis database of this process's own (emptied at its start)
OWN_REDIS_DB = BROKER_URL != os.environ.get("B2BHUB_TEST_BROKER_URL", "")


def pytest_report_header(config):
    return [f"b2bhub backend: {'PostgreSQL + Redis' if IS_POSTGRES else 'embedded (SQLite)'}"]


@pytest.fixture(scope="session")
def backend(tmp_path_factory):
    """The database and broker URLs of this run, with the schema migrated."""
    data_dir = tmp_path_factory.mktemp("data")
    if IS_POSTGRES:
        name = f"b2bhub_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        admin = create_engine(make_url(PG_URL), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        db_url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    else:
        db_url = f"sqlite:///{data_dir / 'b2bhub.sqlite'}"
    broker = BROKER_URL or f"sqla+sqlite:///{data_dir / 'broker.sqlite'}"
    if OWN_REDIS_DB:
        _flush(BROKER_URL)  # the run's own database: what an earlier run left is not ours
    info = {"database_url": db_url, "broker_url": broker, "data_dir": str(data_dir)}
    app = create_app(_config(info))
    with app.app_context():
        from flask_migrate import upgrade
        upgrade(revision="heads")  # the core and each plugin branch
        app.extensions["sqlalchemy"].engines[None].dispose()
    yield info
    if IS_POSTGRES:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _flush(url: str) -> None:
    from kombu import Connection
    with Connection(url) as conn:
        conn.default_channel.client.flushdb()


def _config(info: dict, **extra) -> dict:
    return {"TESTING": True, "DATA_DIR": info["data_dir"],
            "SQLALCHEMY_DATABASE_URI": info["database_url"], "BROKER_URL": info["broker_url"],
            "PAYLOAD_DIR": str(Path(info["data_dir"]) / "payloads"),
            "SECRET_KEY": "test", "WTF_CSRF_ENABLED": False, **extra}


@pytest.fixture
def registry():
    """The plugin types a test may use, registered by hand."""
    reg = PluginRegistry()
    for cls in (testplugins.Recorder, testplugins.Noop, testplugins.ManualSource,
                testplugins.ExternalEcho):
        reg.register(cls)
    return reg


@pytest.fixture
def wakeups():
    """Wake-ups published after commit, recorded in a list instead of the broker."""
    published: list[tuple[int, str]] = []
    return published


@pytest.fixture
def app(backend, registry, wakeups, tmp_path):
    app = create_app(_config(backend, PLUGIN_REGISTRY=registry,
                             PAYLOAD_DIR=str(tmp_path / "payloads"),
                             WAKEUP_PUBLISHER=lambda items: wakeups.extend(items)))
    with app.app_context():
        _empty_tables(app)
        route_cache.clear()
        yield app
        app.extensions["sqlalchemy"].session.remove()
    # the app's reader of history lines (started by a test's event stream) would go on
    # reading for seconds: a read that ran into the next test's TRUNCATE deadlocked with
    # it (each took the tables' locks in its own order)
    if "b2bhub.shared_feed" in app.extensions:
        app.extensions["b2bhub.shared_feed"].stop()
    wakeup_module.set_publisher(None)
    # the app's pooled connections closed now, not when the garbage collector gets to the
    # app: idle ones of earlier tests piled up to 16 per test process on PostgreSQL, and
    # with two test processes (make test) and the processes their tests start, a run
    # went past the server's 100 connections
    with app.app_context():
        for engine in app.extensions["sqlalchemy"].engines.values():
            engine.dispose()


def _empty_tables(app) -> None:
    """Every table empty and every id counting from 1 again, as in a new database.

    On PostgreSQL only the tables a test used are truncated: those with a row, or whose
    id sequence was read since its last restart (a row added and deleted again). A
    TRUNCATE of all of them made new files for each table at every test: after a test
    that used two tables, 188 ms for all against 42 ms for the used ones (medians of
    15, load average 2.5 on 2 cores), most of a short test's setup."""
    engine = app.extensions["sqlalchemy"].engines[None]
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            used = set(conn.scalars(text(" UNION ALL ".join(
                f"SELECT '{name}' WHERE EXISTS (SELECT 1 FROM {name})" for name in tables)
                + " UNION ALL SELECT t.relname FROM pg_class t JOIN pg_depend d ON "
                "d.refobjid = t.oid AND d.deptype IN ('a', 'i') JOIN pg_sequences s ON "
                "s.sequencename = (SELECT relname FROM pg_class WHERE oid = d.objid) "
                "WHERE s.last_value IS NOT NULL AND s.schemaname = current_schema()")))
            used &= set(tables)
            if used:
                conn.execute(text(f"TRUNCATE {', '.join(sorted(used))} "
                                  "RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                conn.execute(text(f"DELETE FROM {table}"))


@pytest.fixture
def db(app):
    from b2bhub.config.extensions import db
    return db


@pytest.fixture
def session(db):
    return db.session


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def api(app, session):
    """A test client that sends an admin bearer token."""
    from b2bhub.services.tokens import create_token
    token = create_token(session, "tests", "admin")
    session.commit()
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client


@pytest.fixture
def record_dir(tmp_path):
    path = tmp_path / "attempts"
    path.mkdir()
    return path


@pytest.fixture
def served(app):
    """The app served on loopback by a real HTTP server; its base URL."""
    from werkzeug.serving import make_server

    from tests.loopback import serve_in_thread
    server = make_server("127.0.0.1", 0, app, threaded=True)
    serve_in_thread(server)
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    # each test's app has its own engine: close its pooled connections now, not at
    # garbage collection (PostgreSQL counts them against max_connections meanwhile)
    app.extensions["sqlalchemy"].session.remove()
    app.extensions["sqlalchemy"].engines[None].dispose()


@pytest.fixture
def hub(session, registry, app, tmp_path):
    """Factories for parties, instances, routes and messages."""
    from tests.factories import Hub
    return Hub(session, registry, app)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server on loopback (``tests/s3kit.py``)."""
    from tests.s3kit import S3Server
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def openpgp_keys(tmp_path_factory):
    """The OpenPGP key pairs of the run (``tests/openpgp_kit.py``), generated once; a
    module's ``keys`` fixture imports them into gpg homes of its own."""
    from tests.openpgp_kit import generated_once
    return generated_once(tmp_path_factory.mktemp("openpgp-keys"))


@pytest.fixture(scope="session")
def as2_certs():
    """Self-signed certificates and keys (RSA 2048) of the AS2 tests' hub, partner and
    intruder, made once per run: a dozen modules use them (through ``test_as2.certs``)
    and made them each anew; they are PEM strings, which no test can change."""
    from tests.as2kit import make_pair
    return {"hub": make_pair("hub.example"), "acme": make_pair("acme.example"),
            "other": make_pair("intruder.example")}


@pytest.fixture
def procs(backend, app, tmp_path):
    """Real processes on the test backend (``tests/procs.py``), every one stopped at the
    end of the test; the broker's queues start empty."""
    from tests.procs import Processes
    app.extensions["celery"].control.purge()
    processes = Processes(backend, tmp_path, app.config["PAYLOAD_DIR"])
    yield processes
    processes.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that started real processes (``procs`` fixture) shows their logs."""
    report = yield
    procs = getattr(item, "funcargs", {}).get("procs")
    if report.failed and procs is not None and getattr(procs, "procs", None):
        report.sections.append(("process logs", procs.logs()))
    return report


@pytest.fixture(scope="session")
def browser():
    """One headless chromium (Debian's, driven by Playwright) for the whole run, shared by
    every browser test module: a second Playwright in the same thread would refuse to
    start inside the first one's event loop."""
    from playwright.sync_api import sync_playwright

    from tests.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: apt-get install -y chromium"
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


# --- the SFTP tests' server (tests/sshd_server.py) -------------------------------------

@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """Debian's sshd on a loopback port of its own, one per test module."""
    from tests.sshd_server import SshServer
    server = SshServer(tmp_path_factory.mktemp("sshd"))
    yield server
    server.close()


@pytest.fixture
def remote(sshd, request):
    """A directory of this test's own on the server (as the server's file system)."""
    import re
    import time
    return sshd.directory(re.sub(r"\W", "_", request.node.name)[:60] + f"-{time.time_ns()}")
