"""b2bhub: a self-hosted B2B message hub."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from flask import Flask
from werkzeug.routing import IntegerConverter

from b2bhub.config import environment as configuration
from b2bhub.config.extensions import csrf, db, migrate

ROOT = Path(__file__).resolve().parent.parent
MAX_ID = 2**63 - 1


class DatabaseId(IntegerConverter):
    """``<int:...>`` in every URL: a whole number a BIGINT column can hold, so a larger
    one is a 404 rather than a database error."""

    def __init__(self, map, *args, **kwargs):
        kwargs.setdefault("max", MAX_ID)
        super().__init__(map, *args, **kwargs)


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


def create_app(test_config: dict | None = None, serve_http: bool = True) -> Flask:
    """The one way in: config, extensions, Celery, blueprints.

    ``serve_http=False`` (the Celery worker and beat, ``b2bhub.runtime.worker``) leaves out the
    API, the UI and the receiving endpoints: a process that serves no request need not
    build them (the API's schemas and OpenAPI document alone cost a worker about 30 MB
    of its resident memory)."""
    app = Flask(__name__, template_folder=str(ROOT / "templates"))
    app.url_map.converters["int"] = DatabaseId
    app.config.update(configuration.load(test_config))
    data_dir = Path(app.config["DATA_DIR"])
    app.config["DATA_DIR_MADE"] = not data_dir.exists()  # by this process, just now
    data_dir.mkdir(parents=True, exist_ok=True)
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = configuration.secret_key(app.config["DATA_DIR"])
    logging.basicConfig(level=app.config["LOG_LEVEL"],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from b2bhub.plugin.registry import get_inspectors
    get_inspectors()  # B2BHUB_INSPECTORS naming no installed inspector stops the start

    from b2bhub.config import database
    database.install()
    db.init_app(app)
    migrate.init_app(app, db, directory=str(ROOT / "migrations"))
    if _version_locations not in migrate.configure_callbacks:
        migrate.configure(_version_locations)
    csrf.init_app(app)

    from b2bhub.runtime.celery_app import celery_init_app
    celery_init_app(app)
    from b2bhub.runtime.hub import hub_init_app
    hub_init_app(app)

    from b2bhub.observability import tracing
    if not serve_http:
        tracing.instrument_celery()  # off unless OTEL_TRACES_EXPORTER names an exporter
        return app
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
