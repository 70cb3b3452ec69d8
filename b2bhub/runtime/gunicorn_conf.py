"""gunicorn's settings for the ``web`` process (``gunicorn -c python:b2bhub.runtime.gunicorn_conf
wsgi:app``, as the Procfile runs it): the listening address and threads from the same
variables as the rest of b2bhub (:func:`b2bhub.config.environment.listen_address`), so a platform's
``PORT`` is honoured without a shell in the Procfile line. Several worker processes
(``WEB_CONCURRENCY``, :func:`b2bhub.config.environment.web_concurrency`): parsing, decrypting and
signing AS2 messages is CPU work that one interpreter lock would serialise. Each worker
is a process of its own (its heartbeat, its logs, its caches checked against the
database's versions, its event streams polling the database), so nothing is shared
between them but the database, the broker and the payload store."""

import os as _os

from b2bhub.config import environment as _config

# gunicorn reads every public name of this module as a setting: helpers stay private

_host, _port = _config.listen_address()
bind = [f"{_host}:{_port}"]
worker_class = "gthread"
workers = _config.web_concurrency()
threads = int(_os.environ.get("B2BHUB_WEB_THREADS") or 64)
graceful_timeout = 10


def worker_int(worker):
    """On SIGINT or SIGQUIT (gunicorn's quick stop: a terminal's Ctrl-C reaches every
    process of its group, the worker's own SIGINT and then its master's SIGQUIT) the
    worker ends its open event streams before it exits. Without this the exit waited
    for the threads serving streams, which never end on their own, until the master
    killed the worker with SIGKILL after ``graceful_timeout`` (a Ctrl-C of ``make run``
    with the UI open took 11 s and logged "was sent SIGKILL!")."""
    from b2bhub.services.streams import close_streams

    close_streams()


def post_worker_init(worker):
    """On SIGTERM the worker first ends its open event streams, then stops as gunicorn
    does: without this a stop waited ``graceful_timeout`` for streams, which never end
    on their own, and gunicorn then killed the worker with SIGKILL.

    Of SIGINT and SIGQUIT only the first is acted on. A Ctrl-C brings both, a few
    milliseconds apart (the terminal's SIGINT, then the master's SIGQUIT), and
    gunicorn's quick exit run again inside the first one, wherever that was, could
    block for good: it takes the thread pool's lock, which the first one may hold just
    then. The first one ends the streams and exits; the master's SIGKILL after
    ``graceful_timeout`` stays the last resort."""
    import signal

    from b2bhub.services.streams import close_streams

    stop = signal.getsignal(signal.SIGTERM)
    quit_now = signal.getsignal(signal.SIGQUIT)

    def on_term(signum, frame):
        close_streams()
        if callable(stop):
            stop(signum, frame)

    def on_quit(signum, frame):
        for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        if callable(quit_now):
            quit_now(signum, frame)  # calls worker_int: the streams end

    signal.signal(signal.SIGTERM, on_term)
    if callable(quit_now):
        signal.signal(signal.SIGQUIT, on_quit)
        signal.signal(signal.SIGINT, on_quit)
    # the app is loaded: its objects live as long as the worker, out of the collector's
    # sight (see b2bhub.runtime.tasks._freeze_startup_objects)
    import gc
    gc.freeze()
