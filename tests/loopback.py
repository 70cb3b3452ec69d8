"""The tests' own loopback servers served from a thread of the test process."""

from __future__ import annotations

import threading

#: how often ``serve_forever`` looks whether ``shutdown()`` was asked for: with the
#: default half second, every test's teardown waited up to 0.5 s for each of its servers
POLL_INTERVAL = 0.02


def serve_in_thread(server) -> threading.Thread:
    """Serve ``server`` (a ``socketserver`` or werkzeug server) from a daemon thread,
    started; its ``shutdown()`` returns within :data:`POLL_INTERVAL`."""
    thread = threading.Thread(target=server.serve_forever,
                              kwargs={"poll_interval": POLL_INTERVAL}, daemon=True)
    thread.start()
    return thread
