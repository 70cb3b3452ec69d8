"""gunicorn serves ``wsgi:app``."""

from b2bhub import create_app

app = create_app()
