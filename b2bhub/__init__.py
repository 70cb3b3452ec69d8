"""b2bhub: a self-hosted B2B message hub.

Importing the package loads Flask, SQLAlchemy and the models: about 80,000 objects that
live as long as the process. The collector does not walk them while they are made, and
they are frozen (``gc.freeze``) once they are: every process of the hub imports this
first. The processes' own start-up (``wsgi.py``, ``b2bhub.runtime.worker``) does the
same around building the app (:func:`starting`); a worker freezes again once it is
ready (``b2bhub.runtime.tasks``), gunicorn's worker once its app is loaded. The
collections while a worker's module was imported took 0.18-0.25 s of its 1.4-2.0 s of
CPU, while ``wsgi`` was imported 0.38-0.43 s of 2.5-2.7 s; with this, none and 0.004 s
(``gc.callbacks`` timing each collection, three runs or more each way). The collector
is left as it was found: on, unless the importer had turned it off."""

from __future__ import annotations

import gc

_collecting = gc.isenabled()
gc.disable()
try:
    import logging
    import sys
    from collections.abc import Iterator
    from contextlib import contextmanager
    from pathlib import Path

    from flask import Flask
    from werkzeug.routing import IntegerConverter, Rule

    from b2bhub.config import environment as configuration
    from b2bhub.config import extensions
    from b2bhub.config.extensions import db
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

ROOT = Path(__file__).resolve().parent.parent
MAX_ID = 2**63 - 1


class DatabaseId(IntegerConverter):
    """``<int:...>`` in every URL: a whole number a BIGINT column can hold, so a larger
    one is a 404 rather than a database error."""

    def __init__(self, map, *args, **kwargs):
        kwargs.setdefault("max", MAX_ID)
        super().__init__(map, *args, **kwargs)


class BuiltWhenUsed(Rule):
    """werkzeug's ``Rule``, each of its two URL builders compiled at its first use.

    werkzeug compiles both builders of every rule (Python source, ``compile()``) when
    the rule is added, 130 rules per app: half of ``create_app``'s CPU once the API's
    document was deferred (72-75 ms with them, 24-42 ms without, 20 apps each, three
    rounds alternated, load average 6.9 on 2 cores), paid by each web process at its
    start and by each of the suite's 2,000 apps, while a process builds URLs for a few
    of its rules. The builder compiled is werkzeug's own: the URLs are the same."""

    def _compile_builder(self, append_unknown: bool = True):
        compiled = None

        def build(rule, *args, **kwargs):
            nonlocal compiled
            if compiled is None:  # two threads at once compile it twice: the same code
                compiled = Rule._compile_builder(rule, append_unknown)
            return compiled(rule, *args, **kwargs)
        return build


def _version_locations(config):
    """Alembic's versions directories: the core's and each plugin type's ``migrations``
    (a branch of its own), so ``b2bhub db upgrade`` applies them all."""
    import os

    from flask import current_app

    from b2bhub.plugin.registry import get_registry
    registry = current_app.config.get("PLUGIN_REGISTRY") or get_registry()
    places = [str(ROOT / "migrations" / "versions")]
    for cls in registry.types().values():
        place = getattr(cls, "migrations", None)
        if place and str(place) not in places:
            places.append(str(place))
    config.set_main_option("path_separator", "os")
    config.set_main_option("version_locations", os.pathsep.join(places))
    return config


@contextmanager
def starting() -> Iterator[None]:
    """A process's start-up: what the block makes lives as long as the process, so the
    collector does not walk it while it is made and it is frozen after (see the
    package's docstring). For a process's entry module only: a block that made garbage
    would keep it."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def create_app(test_config: dict | None = None, serve_http: bool = True) -> Flask:
    """The one way in: config, extensions, Celery, blueprints.

    ``serve_http=False`` (the Celery worker and beat, ``b2bhub.runtime.worker``) leaves out the
    API, the UI and the receiving endpoints: a process that serves no request need not
    build them (the API's schemas and OpenAPI document alone cost a worker about 30 MB
    of its resident memory), nor migrations and CSRF protection (Alembic, Flask-WTF:
    :mod:`b2bhub.config.extensions`)."""
    app = Flask(__name__, template_folder=str(ROOT / "templates"))
    app.url_rule_class = BuiltWhenUsed
    app.url_map.converters["int"] = DatabaseId
    app.config.update(configuration.load(test_config))
    data_dir = Path(app.config["DATA_DIR"])
    app.config["DATA_DIR_MADE"] = not data_dir.exists()  # by this process, just now
    data_dir.mkdir(parents=True, exist_ok=True)
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = configuration.secret_key(app.config["DATA_DIR"])
    logging.basicConfig(level=app.config["LOG_LEVEL"],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Alembic, imported at the first use of ``migrate`` (after this), says at INFO which
    # of its own plugins it set up: noise on every command, not news of a migration.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    from b2bhub.plugin.registry import get_inspectors
    get_inspectors()  # B2BHUB_INSPECTORS naming no installed inspector stops the start

    from b2bhub.config import database
    database.install()
    db.init_app(app)

    from b2bhub.runtime.celery_app import celery_init_app
    celery_init_app(app)
    from b2bhub.runtime.hub import hub_init_app
    hub_init_app(app)

    from b2bhub.observability import tracing
    if not serve_http:
        tracing.instrument_celery()  # off unless OTEL_TRACES_EXPORTER names an exporter
        return app
    migrate, csrf = extensions.migrate, extensions.csrf
    migrate.init_app(app, db, directory=str(ROOT / "migrations"))
    if _version_locations not in migrate.configure_callbacks:
        migrate.configure(_version_locations)
    csrf.init_app(app)
    tracing.instrument_flask(app)
    _name_gunicorn()
    app.after_request(_name_the_server)
    from b2bhub.api import bp as api_bp
    from b2bhub.api.blueprint import init_api
    init_api(app, api_bp)
    csrf.exempt(api_bp)
    from b2bhub.api.metrics import metrics_bp
    app.register_blueprint(metrics_bp)
    from b2bhub.web import web_init_app
    web_init_app(app)
    from b2bhub.plugin.endpoints import endpoints_init_app
    endpoints_init_app(app, csrf)
    from b2bhub.api.callbacks import bp as callbacks_bp
    app.register_blueprint(callbacks_bp)
    csrf.exempt(callbacks_bp)  # the token in the URL is the credential
    return app


def _name_gunicorn() -> None:
    """gunicorn writes ``Server: gunicorn`` on every answer whatever the app sets, and
    has no setting for it: loaded by gunicorn, the app names b2bhub and its version
    there instead (partners log it; an AS2 receipt says who answered)."""
    wsgi = sys.modules.get("gunicorn.http.wsgi")
    if wsgi is not None:
        wsgi.SERVER = configuration.PRODUCT


def _name_the_server(response):
    """Every answer names b2bhub as its Server
    (:func:`b2bhub.config.environment.name_the_server`)."""
    from flask import request
    configuration.name_the_server(request.environ, response)
    return response
