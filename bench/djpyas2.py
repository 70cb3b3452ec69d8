"""django-pyas2 as a peer of the hub in bench/as2_receive.py: a virtualenv of its own
(django-pyas2 pins its own pyas2lib and brings Django, so it never goes into the
project's), a minimal Django project written at run time, its database migrated and
the bench's partnership put in, and gunicorn serving it on loopback.

The virtualenv is made once and reused (``~/.cache/b2bhub-bench/django-pyas2-venv``
unless told another path); it is made again when the requirements below change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import PG_ADMIN_URL, wait_serving

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = Path.home() / ".cache" / "b2bhub-bench" / "django-pyas2-venv"
# Django 5.2: the LTS that installs on the project's Python (django-pyas2 1.2.3 does not
# bound Django), and the first LTS whose SQLite backend can begin its transactions
# IMMEDIATE (on 4.2, two workers writing at once fail with "database is locked" at
# once, whatever the timeout); psycopg for the PostgreSQL backend. With them the
# project's stand-in for the oscrypto that pyas2lib pins (packaging/oscrypto: oscrypto
# 1.3.0 cannot read the version of OpenSSL 3.0.10 and newer, so pyas2lib, and
# django-pyas2 with it, do not import at all).
REQUIREMENTS = ["django-pyas2==1.2.3", "Django>=5.2,<5.3", "gunicorn", "psycopg[binary]"]
OSCRYPTO = HERE.parent / "packaging" / "oscrypto"

SETTINGS = """\
SECRET_KEY = "bench"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "pyas2"]
MIDDLEWARE = []
ROOT_URLCONF = "bench_urls"
DATABASES = {{"default": {database!r}}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
USE_TZ = True
MEDIA_ROOT = {media!r}
DATA_UPLOAD_MAX_MEMORY_SIZE = None  # the hub's receiver takes up to 300 MB here
LOGGING = {{"version": 1, "disable_existing_loggers": False,
           "handlers": {{"stderr": {{"class": "logging.StreamHandler"}}}},
           "loggers": {{"django.request": {{"handlers": ["stderr"], "level": "ERROR"}},
                       "pyas2": {{"handlers": ["stderr"], "level": "WARNING"}}}}}}
"""
URLS = """\
from django.urls import include, path

urlpatterns = [path("pyas2/", include("pyas2.urls"))]
"""
WSGI = """\
from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
"""


def ensure_venv(path: Path) -> Path:
    """The virtualenv at ``path`` with REQUIREMENTS installed (made or remade when
    missing or made with other requirements); its Python."""
    python = path / "bin" / "python"
    marker = path / "b2bhub-bench-requirements.json"
    wanted = [*REQUIREMENTS, "packaging/oscrypto"]
    if python.exists() and marker.exists() and json.loads(marker.read_text()) == wanted:
        return python
    print(f"making the django-pyas2 virtualenv in {path} (once)", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(OSCRYPTO),
                           *REQUIREMENTS], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"pip install {' '.join(REQUIREMENTS)} failed:\n"
                         f"{done.stderr[-2000:]}")
    marker.write_text(json.dumps(wanted))
    return python


def versions(python: Path) -> str:
    """django-pyas2, pyas2lib, Django and gunicorn as installed in its virtualenv."""
    code = ("from importlib.metadata import version as v; print(', '.join(f'{n} {v(n)}' "
            "for n in ('django-pyas2', 'pyas2lib', 'Django', 'gunicorn', 'cryptography')))")
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


class DjangoPyas2:
    """One django-pyas2 server for one bench run: ``start()``, ``url``, ``stored()``,
    ``stop()``. Its database follows the hub's backend: SQLite in the run's temporary
    directory with ``embedded``, a PostgreSQL database of its own (on the same server as
    the hub's) with ``postgres``."""

    def __init__(self, python: Path, backend_name: str, certs: dict, workers: int):
        self.python, self.workers = python, workers
        self.dir = Path(tempfile.mkdtemp(prefix="b2bhub-bench-djpyas2-"))
        self.db_name = f"b2bhub_bench_{os.getpid()}_djpyas2" if backend_name == "postgres" \
            else None
        self.server: subprocess.Popen | None = None
        self.url = ""
        for name, (cert, key) in certs.items():
            (self.dir / f"{name}.pem").write_text(cert)
            (self.dir / f"{name}.key").write_text(key)

    def _database(self) -> dict:
        """Persistent connections on both (Django opens one a request by default), as
        the hub keeps a pool of its own."""
        if self.db_name is None:
            return {"ENGINE": "django.db.backends.sqlite3",
                    "NAME": str(self.dir / "djpyas2.sqlite"), "CONN_MAX_AGE": 600,
                    # as the hub has its SQLite: WAL, synchronous NORMAL, writers wait (30 s)
                    "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30,
                                "init_command": "PRAGMA journal_mode=WAL; "
                                                "PRAGMA synchronous=NORMAL"}}
        from sqlalchemy.engine import make_url
        url = make_url(PG_ADMIN_URL)
        return {"ENGINE": "django.db.backends.postgresql", "NAME": self.db_name,
                "USER": url.username or "", "PASSWORD": url.password or "",
                "HOST": url.host or "", "PORT": str(url.port or ""), "CONN_MAX_AGE": 600}

    def _admin_sql(self, statement: str) -> None:
        from sqlalchemy import create_engine, text
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(statement))
        admin.dispose()

    def _env(self) -> dict[str, str]:
        return {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
                "DJANGO_SETTINGS_MODULE": "bench_settings", "PYTHONPATH": str(self.dir)}

    def _run(self, *args: str) -> str:
        done = subprocess.run([str(self.python), *args], cwd=self.dir, env=self._env(),
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"django-pyas2: {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def start(self, port: int) -> subprocess.Popen:
        media = self.dir / "media"
        media.mkdir()
        if self.db_name is not None:
            self._admin_sql(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            self._admin_sql(f'CREATE DATABASE "{self.db_name}"')
        (self.dir / "bench_settings.py").write_text(
            SETTINGS.format(database=self._database(), media=str(media)))
        (self.dir / "bench_urls.py").write_text(URLS)
        (self.dir / "bench_wsgi.py").write_text(WSGI)
        self._run("-m", "django", "migrate", "--verbosity", "0")
        self._run(str(HERE / "djpyas2_admin.py"), "setup", str(self.dir))
        gunicorn = self.python.parent / "gunicorn"
        self.server = subprocess.Popen(
            [str(gunicorn), "--workers", str(self.workers), "--worker-class", "sync",
             "--bind", f"127.0.0.1:{port}", "--log-level", "warning", "bench_wsgi"],
            cwd=self.dir, env=self._env())
        self.url = f"http://127.0.0.1:{port}/pyas2/as2receive"
        return wait_serving(self.server, self.url, "django-pyas2 (gunicorn)")

    def stored(self) -> dict[str, list[str]]:
        """Message id -> [status ("S": success), sha256 of the payload django-pyas2
        kept] of every message it received."""
        return json.loads(self._run(str(HERE / "djpyas2_admin.py"), "stored"))

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            self.server.wait(30)
        self.server = None

    def remove(self) -> None:
        self.stop()
        if self.db_name is not None:
            self._admin_sql(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        shutil.rmtree(self.dir, ignore_errors=True)
