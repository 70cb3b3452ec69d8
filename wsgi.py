"""gunicorn serves ``wsgi:app``; the process registers itself and ships its logs."""

from b2bhub import create_app
from b2bhub.agent import start_agent

app = create_app()
start_agent(app, "web")
