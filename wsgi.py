"""gunicorn serves ``wsgi:app``; the process registers itself and ships its logs."""

from b2bhub import create_app, starting
from b2bhub.runtime.agent import start_agent
from b2bhub.runtime.hub import prepare_publisher

with starting():
    app = create_app()
    prepare_publisher(app)  # the first intake does not pay the broker client's imports
start_agent(app, "web")
