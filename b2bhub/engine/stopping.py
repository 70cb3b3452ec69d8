"""Stopping a worker without tearing a settlement (SPEC 5 "Stopping").

On SIGTERM the worker stops claiming (``requested``), lets the running attempt finish
for ``grace`` seconds, then cancels it by raising :class:`AttemptCancelled` in the
attempt's thread (the main thread: workers run one task at a time). A settlement runs
inside :meth:`StopControl.settling`, where a cancellation waits until it has committed.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class AttemptCancelled(BaseException):
    """Raised into a running attempt when the stop grace period is over.

    A BaseException so that a plugin's ``except Exception`` does not swallow it.
    """


class StopControl:
    def __init__(self) -> None:
        self.requested = threading.Event()
        self._attempt_running = False
        self._settling = False

    def request(self, grace: float) -> None:
        """Stop claiming now; cancel a running attempt after ``grace`` seconds."""
        if self.requested.is_set():
            return
        self.requested.set()
        if threading.current_thread() is threading.main_thread() and grace > 0:
            signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, grace)
        elif grace <= 0:
            self._cancel()

    def _on_alarm(self, signum, frame) -> None:
        self._cancel()

    def _cancel(self) -> None:
        # during a settlement nothing is raised: the settlement commits whole, and the
        # runner, seeing ``requested``, claims nothing after it
        if self._attempt_running and not self._settling:
            raise AttemptCancelled("stop grace period over")

    @contextmanager
    def attempt(self):
        self._attempt_running = True
        try:
            yield
        finally:
            self._attempt_running = False

    @contextmanager
    def settling(self):
        """Run a settlement to its end even if the grace period ends meanwhile."""
        self._settling = True
        try:
            yield
        finally:
            self._settling = False



#: the process-wide stop control of a worker
stop_control = StopControl()
