"""``b2bhub run`` with real children: a child that dies makes the whole hub stop and
fail (so a service manager restarts it), naming the child and how it ended; a stop
that was asked for exits 0."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests.procs import BIN, free_port, wait_until

pytestmark = pytest.mark.processes


def _hub(procs):
    """``b2bhub run`` with one worker, up with every child ready; its children's pids."""
    hub = procs.start("hub", [str(BIN / "b2bhub"), "run"],
                      {"B2BHUB_PORT": str(free_port()), "B2BHUB_WORKERS": "1"})
    hub.wait_in_log("started beat", timeout=60)
    hub.wait_in_log(" ready.", timeout=90)  # the worker's own line
    children = {name: int(pid) for name, pid in
                re.findall(r"b2bhub: started (\w+) \(pid (\d+)\)", hub.output())}
    assert set(children) == {"web", "worker1", "beat"}
    return hub, children


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_child_killed_by_a_signal_stops_the_others_and_fails_the_hub(procs):
    hub, children = _hub(procs)

    os.kill(children["worker1"], signal.SIGKILL)

    status = hub.wait_exit(60)
    assert status == 128 + signal.SIGKILL, hub.output()[-3000:]
    assert (f"b2bhub: worker1 (pid {children['worker1']}) was killed by SIGKILL; "
            "stopping the others, exit status 137") in hub.output()
    wait_until(lambda: all(_gone(pid) for pid in children.values()), 10,
               "every child gone")


def test_a_child_that_exits_on_its_own_fails_the_hub_with_its_status(procs):
    hub, children = _hub(procs)

    os.kill(children["beat"], signal.SIGTERM)  # beat ends on its own, status 0

    assert hub.wait_exit(60) == 1, hub.output()[-3000:]
    assert (f"b2bhub: beat (pid {children['beat']}) exited with status 0; stopping the "
            "others, exit status 1") in hub.output()
    wait_until(lambda: all(_gone(pid) for pid in children.values()), 10,
               "every child gone")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_that_was_asked_for_exits_0(procs, sig):
    hub, children = _hub(procs)

    hub.signal(sig)

    assert hub.wait_exit(60) == 0, hub.output()[-3000:]
    assert "stopping the others" not in hub.output()
    assert all(_gone(pid) for pid in children.values())
