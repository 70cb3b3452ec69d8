"""Fault-injection hooks for the fault suite (``bench/faults``); inert unless set.

Two environment variables, read by the process that has them and by no other:

``B2BHUB_FAULT_PAUSE=POINT:SECONDS[:NTH]``
    The NTH time (default 1) a worker passes POINT it logs ``fault pause at POINT`` and
    sleeps SECONDS, so the suite can kill it at exactly that point. Points:
    ``claimed`` (a batch's claim committed, before its first attempt) and ``attempted``
    (a plugin returned its outcome, the side effect done, before the settlement),
    ``settling`` (a settlement's rows written, before its commit) and ``sweeping`` (the
    sweep's guard taken, before its first step).
``B2BHUB_FAKE_CLOCK_FILE=PATH``
    :func:`b2bhub.models.base.utcnow` adds the number of seconds written in PATH (read
    again at most every 0.2 s; missing or empty is 0): the clock of one process stepped
    forward or back where the system clock cannot be moved.

Without them each hook is one dictionary lookup, done once per process.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)
_PAUSE = os.environ.get("B2BHUB_FAULT_PAUSE", "")
_passed: dict[str, int] = {}


def pause(point: str) -> None:
    """Sleep here when ``B2BHUB_FAULT_PAUSE`` names this point and its turn has come."""
    if not _PAUSE:
        return
    name, _, rest = _PAUSE.partition(":")
    if name != point:
        return
    seconds, _, nth = rest.partition(":")
    _passed[point] = _passed.get(point, 0) + 1
    if _passed[point] == int(nth or 1):
        log.warning("fault pause at %s for %s s", point, seconds)
        time.sleep(float(seconds))


class FakeClockOffset:
    """The seconds to add to this process's clock, read from a file now and then."""

    every = 0.2

    def __init__(self, path: str):
        self.path = path
        self._read_at = -1.0
        self._seconds = 0.0

    def seconds(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= self.every:
            self._read_at = now
            try:
                with open(self.path, encoding="ascii") as fh:
                    self._seconds = float(fh.read().strip() or 0)
            except (OSError, ValueError):
                self._seconds = 0.0
        return self._seconds


_clock_file = os.environ.get("B2BHUB_FAKE_CLOCK_FILE", "")
fake_clock = FakeClockOffset(_clock_file) if _clock_file else None
