"""Fault-injection hooks for the fault suite (``bench/faults.py``); inert unless set.

``B2BHUB_FAULT_PAUSE=POINT:SECONDS[:NTH]``, read by the process that has it and by no
other: the NTH time (default 1) a worker passes POINT it logs ``fault pause at POINT``
and sleeps SECONDS, so the suite can kill it at exactly that point. Points: ``claimed``
(a batch's claim committed, before its first attempt) and ``attempted`` (a plugin
returned its outcome, the side effect done, before the settlement), ``settling`` (a
settlement's rows written, before its commit) and ``sweeping`` (the sweep's guard taken,
before its first step). Without it each hook is one string test.

The fault suite's other hook, a process's clock moved by a file
(``B2BHUB_FAKE_CLOCK_FILE``), belongs to the clock: :mod:`b2bhub.models.base`.
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
