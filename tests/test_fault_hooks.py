"""The fault suite's hooks (the pauses of ``b2bhub/engine/faults.py``, the clock of
``b2bhub/models/base.py``): inert unless their variable is set, and doing what the suite
relies on when it is."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

from b2bhub.engine import faults
from b2bhub.models import base


def test_without_the_variables_no_hook_pauses_or_moves_the_clock():
    code = ("import os, time; from b2bhub.engine import faults;"
            "from b2bhub.models import base, utcnow;"
            "from datetime import datetime, UTC;"
            "t = time.monotonic(); faults.pause('claimed'); faults.pause('attempted');"
            "skew = abs((utcnow() - datetime.now(UTC).replace(tzinfo=None)).total_seconds());"
            "print(base.fake_clock is None, time.monotonic() - t < 0.5, skew < 1)")
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == ["True", "True", "True"]


def test_the_fake_clock_moves_utcnow_by_the_seconds_in_its_file(tmp_path):
    offset = tmp_path / "offset"
    offset.write_text("600")
    code = ("from b2bhub.models import utcnow; from datetime import datetime, UTC;"
            "print(round((utcnow() - datetime.now(UTC).replace(tzinfo=None))"
            ".total_seconds()))")
    env = {"PATH": "/usr/bin:/bin", "B2BHUB_FAKE_CLOCK_FILE": str(offset)}
    ahead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, check=True).stdout.strip()
    assert ahead == "600"
    clock = base.FakeClockOffset(str(offset))
    assert clock.seconds() == 600
    offset.write_text("-600")
    time.sleep(clock.every)
    assert clock.seconds() == -600
    offset.unlink()  # gone: the real clock
    time.sleep(clock.every)
    assert clock.seconds() == 0


def test_a_pause_waits_at_its_point_on_its_turn_only(monkeypatch, caplog):
    monkeypatch.setattr(faults, "_PAUSE", "attempted:0.3:2")
    monkeypatch.setattr(faults, "_passed", {})
    caplog.set_level(logging.WARNING, "b2bhub.engine.faults")
    took = []
    for point in ("claimed", "attempted", "attempted", "attempted"):
        started = time.monotonic()
        faults.pause(point)
        took.append(time.monotonic() - started >= 0.3)
    assert took == [False, False, True, False]
    assert [r.getMessage() for r in caplog.records] == ["fault pause at attempted for 0.3 s"]
