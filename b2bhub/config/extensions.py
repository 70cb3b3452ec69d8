"""Extensions, created unbound; ``create_app`` binds them. No module keeps the app.

``db`` is made at import. The others serve requests or the command line only (sessions,
forms, the UI's language, migrations), so each is made at its first use, by the module
``__getattr__`` below: a worker or beat process, which serves no request and runs no
migration, never imports Flask-Migrate (and Alembic with it), Flask-WTF, Flask-Login or
Flask-Babel. That keeps about 9 MB out of every worker's resident memory: an idle
``celery worker --pool solo`` on PostgreSQL + Redis held 141 MB before, 133 MB after
(VmHWM in ``/proc/<pid>/status``), which leaves a 1 GB SFTP download (about 10 MB more)
well under the 150 MB that issue 39 allows a process."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from flask_sqlalchemy import SQLAlchemy

from b2bhub.models.base import Base

if TYPE_CHECKING:  # for readers and type checkers; made lazily below
    from flask_babel import Babel
    from flask_login import LoginManager
    from flask_migrate import Migrate
    from flask_wtf import CSRFProtect

    migrate: Migrate
    csrf: CSRFProtect
    login_manager: LoginManager
    babel: Babel

# The models are plain SQLAlchemy (the engine uses them without Flask); Flask-SQLAlchemy
# manages sessions and engines over the same metadata, and Flask-Migrate reads it.
db = SQLAlchemy(metadata=Base.metadata)


def _migrate():
    from flask_migrate import Migrate
    return Migrate(render_as_batch=True, compare_type=True)


def _csrf():
    from flask_wtf import CSRFProtect
    return CSRFProtect()


def _login_manager():
    from flask_login import LoginManager
    return LoginManager()


def _babel():
    from flask_babel import Babel
    return Babel()


_MAKERS = {"migrate": _migrate, "csrf": _csrf, "login_manager": _login_manager,
           "babel": _babel}
_made: dict[str, Any] = {}
_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    """The one instance of a lazily made extension (PEP 562)."""
    maker = _MAKERS.get(name)
    if maker is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        if name not in _made:
            _made[name] = maker()
        return _made[name]
