"""b2bhub: a self-hosted B2B message hub."""

from __future__ import annotations

import logging
from pathlib import Path

from flask import Flask
from werkzeug.routing import IntegerConverter

from b2bhub import config as configuration
from b2bhub.extensions import csrf, db, migrate

ROOT = Path(__file__).resolve().parent.parent
MAX_ID = 2**63 - 1


class DatabaseId(IntegerConverter):
    """``<int:...>`` in every URL: a whole number a BIGINT column can hold, so a larger
    one is a 404 rather than a database error."""

    def __init__(self, map, *args, **kwargs):
        kwargs.setdefault("max", MAX_ID)
        super().__init__(map, *args, **kwargs)


def create_app(test_config: dict | None = None) -> Flask:
    """The one way in: config, extensions, Celery, blueprints."""
    app = Flask(__name__, template_folder=str(ROOT / "templates"))
    app.url_map.converters["int"] = DatabaseId
    app.config.update(configuration.load(test_config))
    Path(app.config["DATA_DIR"]).mkdir(parents=True, exist_ok=True)
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = configuration.secret_key(app.config["DATA_DIR"])
    logging.basicConfig(level=app.config["LOG_LEVEL"],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from b2bhub import dbsetup
    dbsetup.install()
    db.init_app(app)
    migrate.init_app(app, db, directory=str(ROOT / "migrations"))
    csrf.init_app(app)

    from b2bhub.celery_app import celery_init_app
    celery_init_app(app)
    from b2bhub.hub import hub_init_app
    hub_init_app(app)

    from b2bhub.api import bp as api_bp
    from b2bhub.api.blueprint import init_api
    init_api(app, api_bp)
    csrf.exempt(api_bp)
    from b2bhub.api.metrics import metrics_bp
    app.register_blueprint(metrics_bp)
    from b2bhub.web import web_init_app
    web_init_app(app)
    from plugins.as2.views import bp as as2_bp
    app.register_blueprint(as2_bp)
    csrf.exempt(as2_bp)  # authenticated by signatures and profiles, not by a session
    return app
