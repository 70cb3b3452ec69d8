"""moto's S3-compatible server as a WSGI application, for a WSGI server that keeps
connections alive (``gunicorn -k gthread bench.moto_app:app``, as
bench/payload_backends.py runs it). ``moto_server`` itself runs on werkzeug's
development server, which closes the connection after every answer: each request then
paid a new TCP connection on both sides, which neither AWS nor MinIO makes a client pay.
One process only: moto keeps the objects in its memory."""

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

app = DomainDispatcherApplication(create_backend_app)
