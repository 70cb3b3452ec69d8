"""Configuration from ``B2BHUB_*`` environment variables, with defaults that work.

Every variable is listed in :data:`VARIABLES` (name, default, meaning); the README's
configuration table is checked against it by ``tests/test_docs.py``.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

try:
    VERSION = metadata.version("b2bhub")
except metadata.PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0"
#: how the hub names itself on the wire: every answer's ``Server`` header (gunicorn's
#: through :mod:`b2bhub.runtime.gunicorn_conf`, else :func:`b2bhub.create_app`'s), and the
#: ``User-Agent`` and ``Reporting-UA`` of what protocols send
PRODUCT = f"b2bhub/{VERSION}"


def name_the_server(environ: dict, response) -> None:
    """Name b2bhub as the answer's Server: under gunicorn its own header already does
    (:func:`b2bhub._name_gunicorn`; one more would make two), another server (Werkzeug's
    in tests and ``flask run``) writes its own only when the app gives none."""
    if not environ.get("SERVER_SOFTWARE", "").startswith("gunicorn/"):
        response.headers.setdefault("Server", PRODUCT)


#: (variable, default, meaning). A default of None means "derived", see ``load()``.
VARIABLES: list[tuple[str, str | None, str]] = [
    ("B2BHUB_DATA_DIR", "./var", "where the embedded database, broker and payloads live"),
    ("B2BHUB_DATABASE_URL", None,
     "SQLAlchemy URL; default SQLite in the data directory (postgresql+psycopg://... "
     "for PostgreSQL)"),
    ("B2BHUB_BROKER_URL", None,
     "Celery broker; default kombu's SQLAlchemy transport on SQLite in the data directory "
     "(redis://... for Redis)"),
    ("B2BHUB_PAYLOAD_DIR", None, "payload store; default <data dir>/payloads"),
    ("B2BHUB_PAYLOAD_URL", None, "payload store by URL: s3://bucket/prefix for an "
     "S3-compatible object store, or file:///path; default the B2BHUB_PAYLOAD_DIR store"),
    ("B2BHUB_S3_ENDPOINT_URL", None, "address of an S3-compatible server for an s3:// "
     "payload store; default AWS (credentials and region from the standard AWS variables)"),
    ("B2BHUB_HOST", "127.0.0.1", "address the web process listens on"),
    ("B2BHUB_PORT", "8000", "port the web process listens on"),
    ("B2BHUB_PUBLIC_URL", None, "the hub's address as destinations reach it, for the "
     "callback URLs of receipts; default http://<B2BHUB_HOST>:<B2BHUB_PORT> (set it "
     "behind a proxy or on a platform)"),
    ("B2BHUB_WORKERS", "2", "worker processes `b2bhub run` starts"),
    ("B2BHUB_WEB_CONCURRENCY", None, "web worker processes (gunicorn's workers, each "
     "with B2BHUB_WEB_THREADS threads); default the CPU cores this process may use, 2 to "
     "8"),
    ("B2BHUB_WEB_THREADS", "64", "threads of each web worker process; each open event "
     "stream holds one, 4 are kept for other requests"),
    ("B2BHUB_SECRET_KEY", None, "session and CSRF signing key; default a random key kept in "
     "the data directory"),
    ("B2BHUB_LOG_LEVEL", "info", "log level of every process"),
    ("B2BHUB_LOG_STREAM_LEVEL", "info", "lowest level of the log records every process "
     "publishes to the Logs page and /api/v1/logs (never below B2BHUB_LOG_LEVEL)"),
    ("B2BHUB_LANGUAGE", "en", "the hub's own language (en or pt_BR): the e-mail "
     "notifications', and the UI's for a user who chose none and whose browser asks for "
     "none the hub has (docs/i18n.md)"),
    ("B2BHUB_STOP_GRACE", "5", "seconds a running attempt may finish after SIGTERM"),
    ("B2BHUB_CLEANUP_TICK", "60", "seconds between beat's looks at whether the nightly "
     "cleanup's time (System > Settings, UTC) has come"),
    ("B2BHUB_WORKER_QUEUES", "deliveries,default",
     "queues a worker consumes (add an instance's own queue for dedicated workers)"),
    ("B2BHUB_INSPECTORS", None, "the document inspectors that read envelopes at intake, "
     "by name, comma-separated (x12,edifact); default every registered one; empty: none, "
     "inspection off"),
    ("B2BHUB_FAULT_PAUSE", "", "fault suite only: POINT:SECONDS[:NTH], a worker pauses "
     "there so it can be killed there (b2bhub/engine/faults.py)"),
    ("B2BHUB_FAKE_CLOCK_FILE", "", "fault suite only: a file holding seconds added to "
     "this process's clock (b2bhub/models/base.py)"),
]


#: The variables a Heroku-style platform hands its services to an app by, read when the
#: ``B2BHUB_*`` variable beside each is not set (the ``B2BHUB_*`` one always wins).
#: With ``PORT`` set the web process listens on every address (``0.0.0.0``) unless
#: ``B2BHUB_HOST`` says otherwise: the platform's router reaches it from outside.
PLATFORM_VARIABLES: list[tuple[str, str, str]] = [
    ("DATABASE_URL", "B2BHUB_DATABASE_URL",
     "the platform's database (postgres:// and postgresql:// use the psycopg 3 driver)"),
    ("REDIS_URL", "B2BHUB_BROKER_URL", "the platform's Redis, as the Celery broker"),
    ("PORT", "B2BHUB_PORT", "the port the platform routes to; the web process then "
     "listens on 0.0.0.0"),
    ("WEB_CONCURRENCY", "B2BHUB_WEB_CONCURRENCY", "the web worker processes a platform "
     "sizes for its machine"),
]


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def inspector_names() -> tuple[str, ...] | None:
    """The inspectors ``B2BHUB_INSPECTORS`` names, in its order; None when it is unset
    (every registered one runs), ``()`` when it is set empty (none: inspection off).
    Which names exist is the registry's to say
    (:func:`b2bhub.plugin.registry.get_inspectors`)."""
    value = os.environ.get("B2BHUB_INSPECTORS")
    if value is None:
        return None
    return tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))


def database_url_of(url: str) -> str:
    """The SQLAlchemy URL of a database URL: a plain ``postgres://`` or
    ``postgresql://`` (as platforms hand it over) gets the psycopg 3 driver, which is
    the one b2bhub installs; any other URL is kept as it is."""
    for scheme in ("postgres://", "postgresql://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme):]
    return url


def listen_address() -> tuple[str, int]:
    """Where the web process listens: ``B2BHUB_HOST``:``B2BHUB_PORT``, else the
    platform's ``PORT`` on every address, else 127.0.0.1:8000."""
    platform_port = _env("PORT")
    port = int(_env("B2BHUB_PORT") or platform_port or "8000")
    host = _env("B2BHUB_HOST") or ("0.0.0.0" if platform_port else "127.0.0.1")
    return host, port


def web_concurrency() -> int:
    """How many web worker processes: ``B2BHUB_WEB_CONCURRENCY``, else
    ``WEB_CONCURRENCY`` (the name platforms and gunicorn use), else the CPU cores this
    process may run on, at least 2 (a request that waits on the database or a disk
    leaves the core to the other) and at most 8 (each holds its own connection pool
    and threads)."""
    value = _env("B2BHUB_WEB_CONCURRENCY") or _env("WEB_CONCURRENCY")
    if value is not None:
        workers = int(value) if value.isdigit() else 0
        if workers < 1:
            raise ValueError(f"WEB_CONCURRENCY must be a whole number of 1 or more, not "
                             f"{value!r}")
        return workers
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return min(8, max(2, cores))


def load(overrides: dict | None = None) -> dict:
    """Build the Flask config dict from the environment, then ``overrides``."""
    overrides = dict(overrides or {})
    data_dir = Path(overrides.pop("DATA_DIR", None) or _env("B2BHUB_DATA_DIR", "./var"))
    data_dir = data_dir.resolve()
    url = _env("B2BHUB_DATABASE_URL") or _env("DATABASE_URL")
    database_url = database_url_of(url) if url else f"sqlite:///{data_dir / 'b2bhub.sqlite'}"
    broker_url = (_env("B2BHUB_BROKER_URL") or _env("REDIS_URL")
                  or f"sqla+sqlite:///{data_dir / 'broker.sqlite'}")
    host, port = listen_address()
    cfg = {
        "DATA_DIR": str(data_dir),
        "SQLALCHEMY_DATABASE_URI": database_url,
        "BROKER_URL": broker_url,
        "PAYLOAD_DIR": _env("B2BHUB_PAYLOAD_DIR", str(data_dir / "payloads")),
        "PAYLOAD_URL": _env("B2BHUB_PAYLOAD_URL"),
        "S3_ENDPOINT_URL": _env("B2BHUB_S3_ENDPOINT_URL"),
        "SECRET_KEY": _env("B2BHUB_SECRET_KEY"),
        "LOG_LEVEL": _env("B2BHUB_LOG_LEVEL", "info").upper(),
        "LOG_STREAM_LEVEL": _env("B2BHUB_LOG_STREAM_LEVEL", "info").upper(),
        "STOP_GRACE": float(_env("B2BHUB_STOP_GRACE", "5")),
        "HOST": host,
        "PORT": port,
        "PUBLIC_URL": _env("B2BHUB_PUBLIC_URL"),
        "WORKERS": int(_env("B2BHUB_WORKERS", "2")),
        "WEB_THREADS": int(_env("B2BHUB_WEB_THREADS", "64")),
        "WEB_CONCURRENCY": web_concurrency(),
        "WORKER_QUEUES": _env("B2BHUB_WORKER_QUEUES", "deliveries,default"),
        "SQLALCHEMY_ENGINE_OPTIONS": {},
        "WTF_CSRF_TIME_LIMIT": None,
        # the language of a visitor whose browser asks for none we have, and of the
        # e-mail notifications (docs/i18n.md)
        "LANGUAGE": language(),
    }
    cfg.update(overrides)
    if not cfg["PUBLIC_URL"]:  # listening on every address: loopback reaches it here
        host = "127.0.0.1" if cfg["HOST"] in ("0.0.0.0", "::", "") else cfg["HOST"]
        cfg["PUBLIC_URL"] = f"http://{host}:{cfg['PORT']}"
    if cfg["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        cfg["SQLALCHEMY_ENGINE_OPTIONS"] = {"connect_args": {"timeout": 30}}
    else:
        # no pool_pre_ping: an idle connection is pinged before use (b2bhub.config.database)
        cfg["SQLALCHEMY_ENGINE_OPTIONS"] = {"connect_args": {
            "options": postgres_options(os.environ.get("PGOPTIONS", ""))}}
    return cfg


def language() -> str:
    """B2BHUB_LANGUAGE: the hub's own language (docs/i18n.md), as set."""
    return _env("B2BHUB_LANGUAGE", "en")


def postgres_options(extra: str = "") -> str:
    """The server settings of every PostgreSQL connection: the environment's
    PGOPTIONS, which the connection's own options would otherwise hide.

    PostgreSQL's own plan caching (``plan_cache_mode`` left at ``auto``): psycopg
    prepares a statement once it has run five times, and PostgreSQL then keeps a
    generic plan, as it keeps one for each foreign-key check. A plan made while a table
    was empty is a sequential scan, and was kept while the tables grew (the lookups by
    id of a batch's messages took 1.1-1.4 ms instead of 0.13-0.25): so every connection
    discards its plans once they are a few seconds old (:mod:`b2bhub.config.database`). The hub
    planned every execution instead (``force_custom_plan``) until that cost more than it
    saved: half of PostgreSQL's CPU per HTTP intake, a third of its time per AS2
    message, 20 us per foreign-key check (``bench/plan_cache.py``)."""
    return extra.strip()


def secret_key(data_dir: str) -> str:
    """A random key kept in the data directory, so sessions survive a restart."""
    path = Path(data_dir) / "secret_key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(os.urandom(32).hex())
        path.chmod(0o600)
    return path.read_text().strip()
