"""``celery -A b2bhub.runtime.worker worker`` / ``beat`` find ``celery_app`` here."""

from b2bhub import create_app, starting

with starting():
    flask_app = create_app(serve_http=False)  # serves no request: no API, UI or endpoints
celery_app = flask_app.extensions["celery"]
