"""A hub process's start-up runs without the cyclic collector walking what it imports
(the package docstring of :mod:`b2bhub`), and leaves the collector as it found it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.procs import ROOT

_COUNTED = """
import gc, sys
runs = []
gc.callbacks.append(lambda phase, info: runs.append(1) if phase == "start" else None)
if sys.argv[2] == "off":
    gc.disable()
import importlib
importlib.import_module(sys.argv[1])
print(len(runs), gc.isenabled(), gc.get_freeze_count())
"""


def _start(module: str, collector: str, tmp_path) -> tuple[int, bool, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("B2BHUB_")}
    env["B2BHUB_DATA_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", _COUNTED, module, collector], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    runs, enabled, frozen = done.stdout.split()
    return int(runs), enabled == "True", int(frozen)


@pytest.mark.parametrize("module", ["b2bhub.runtime.worker", "wsgi"])
def test_a_process_starts_without_walking_its_imports_and_collects_after(module, tmp_path):
    """Before, importing the worker's module ran 310 collections and ``wsgi`` 415
    (0.2-0.4 s of CPU); the objects made are frozen, and the collector is on after."""
    runs, enabled, frozen = _start(module, "on", tmp_path)
    assert runs < 30
    assert enabled
    assert frozen > 50_000


def test_an_importer_that_turned_the_collector_off_finds_it_off(tmp_path):
    runs, enabled, _frozen = _start("b2bhub", "off", tmp_path)
    assert (runs, enabled) == (0, False)


def test_a_failed_start_leaves_the_collector_on():
    import gc

    from b2bhub import starting
    assert gc.isenabled()
    gc.collect()  # nothing of this process's garbage is frozen with the block's objects
    with pytest.raises(RuntimeError), starting():
        raise RuntimeError("the start failed")
    assert gc.isenabled()
