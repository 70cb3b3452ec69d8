"""``b2bhub run`` with real children: a child that dies makes the whole hub stop and
fail (so a service manager restarts it), naming the child and how it ended; a stop
that was asked for exits 0."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

import b2bhub
from tests.procs import BIN, Proc, free_port, wait_until

pytestmark = pytest.mark.processes


def _hub(procs, port: int | None = None):
    """``b2bhub run`` with one worker, up with every child ready; its children's pids."""
    hub = procs.start("hub", [str(BIN / "b2bhub"), "run"],
                      {"B2BHUB_PORT": str(port or free_port()), "B2BHUB_WORKERS": "1"})
    hub.wait_in_log("started beat", timeout=60)
    hub.wait_in_log(" ready.", timeout=90)  # the worker's own line
    # beat up (b2bhub.runtime.tasks): a SIGTERM before beat installs its handlers kills
    # it outright, one while it opens its schedule ends it with status 1
    hub.wait_in_log("beat: schedule open, agent running", timeout=90)
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_ends_open_event_streams_first_and_kills_nothing(procs, sig):
    """An open event stream never ends on its own: the web worker ends it first, so the
    stop neither waits out gunicorn's graceful timeout (10 s) nor ends in a SIGKILL.
    How long a stop takes is measured by bench/stop_time.py (goal: under 3 s)."""
    port = free_port()
    hub, children = _hub(procs, port)
    token = procs.cli("token", "create", "stream-reader", "--role", "viewer")
    assert token.returncode == 0, token.stderr
    url = f"http://127.0.0.1:{port}/api/v1/events"
    headers = {"Authorization": f"Bearer {token.stdout.strip()}"}
    ended = []

    def listen():
        with requests.get(url, headers=headers, stream=True, timeout=30) as answer:
            assert answer.status_code == 200
            for _ in answer.iter_content(chunk_size=None):
                pass
        ended.append(time.monotonic())

    streams = [threading.Thread(target=listen, daemon=True) for _ in range(3)]
    for stream in streams:
        stream.start()
    time.sleep(1.0)  # the streams are open and connected

    started = time.monotonic()
    hub.signal(sig)
    assert hub.wait_exit(30) == 0, hub.output()[-3000:]
    took = time.monotonic() - started

    assert took < 9.0, f"the stop took {took:.1f} s: it waited for the open streams"
    assert "SIGKILL" not in hub.output(), hub.output()[-3000:]
    for stream in streams:
        stream.join(5)
    assert len(ended) == 3  # every stream ended cleanly, not cut off
    assert all(_gone(pid) for pid in children.values())


def _group(pgid: int) -> list[int]:
    """The pids of the processes in process group ``pgid`` (zombies included: a
    process not yet reaped has not ended as far as a terminal can tell)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp
            pids.append(int(entry))
    return pids


def test_a_ctrl_c_of_the_whole_group_ends_streams_and_every_process_at_once(procs):
    """A terminal's Ctrl-C sends SIGINT to every process of its foreground group at
    once: the hub, gunicorn's master and workers, the Celery worker, beat. Each takes
    its own quick way out (gunicorn's workers its SIGINT and then the master's SIGQUIT),
    and an open event stream must end at once on that way too: every process gone
    within 5 s, no SIGKILL. It once took 11 s, the workers killed by their master
    after graceful_timeout. The stop time is printed (pytest -s) as measured."""
    port = free_port()
    hub, children = _hub(procs, port)  # started in a session, so a group, of its own
    assert os.getpgid(hub.pid) == hub.pid
    token = procs.cli("token", "create", "stream-reader", "--role", "viewer")
    assert token.returncode == 0, token.stderr
    headers = {"Authorization": f"Bearer {token.stdout.strip()}"}
    connected = threading.Semaphore(0)
    ended: list[tuple[str, float]] = []

    def listen(path: str):
        url = f"http://127.0.0.1:{port}/api/v1/{path}"
        try:
            with requests.get(url, headers=headers, stream=True, timeout=30) as answer:
                assert answer.status_code == 200
                for number, _ in enumerate(answer.iter_content(chunk_size=None)):
                    if number == 0:
                        connected.release()  # ": connected", the stream is served
            ended.append(("ended", time.monotonic()))
        except Exception as exc:
            ended.append((repr(exc), time.monotonic()))

    # the history lines (the UI's live pages) on the shared feed, the log records on a
    # poll of their own: both kinds of stream
    streams = [threading.Thread(target=listen, args=(path,), daemon=True)
               for path in ("events", "events", "logs/stream")]
    for stream in streams:
        stream.start()
    for _ in streams:
        assert connected.acquire(timeout=30), "a stream did not connect"
    group = _group(hub.pid)
    assert set(children.values()) < set(group) and len(group) >= 5  # + gunicorn's workers

    started = time.monotonic()
    os.killpg(hub.pid, signal.SIGINT)
    status = None
    while time.monotonic() - started < 30:
        status = hub.popen.poll()  # reaps the hub, which reaps its children
        if status is not None and not _group(hub.pid):
            break
        time.sleep(0.05)
    took = time.monotonic() - started
    print(f"\nevery process of the group gone {took:.2f} s after the SIGINT")

    left = _group(hub.pid)
    assert not left, f"still running after {took:.1f} s: {left}\n{hub.output()[-3000:]}"
    assert took < 5.0, f"the stop took {took:.1f} s\n{hub.output()[-3000:]}"
    assert status == 0, hub.output()[-3000:]
    assert "SIGKILL" not in hub.output(), hub.output()[-3000:]
    for stream in streams:
        stream.join(5)
    # every stream's connection ended, cleanly (its chunked body closed) and at once
    assert [how for how, _ in ended] == ["ended"] * len(streams), ended
    assert all(at - started < 5.0 for _, at in ended), ended


def test_every_child_runs_where_b2bhub_run_was_started(procs, tmp_path):
    """``make run`` from a checkout, or ``b2bhub run`` anywhere else, with the default
    data directory ``./var``: the web process, the worker and beat use the database and
    broker the command migrated in that directory, never one beside the package."""
    run_dir = tmp_path / "here"
    run_dir.mkdir()
    env = {k: v for k, v in procs.env({"B2BHUB_PORT": str(free_port()),
                                       "B2BHUB_WORKERS": "1"}).items()
           if k not in ("B2BHUB_DATABASE_URL", "B2BHUB_BROKER_URL", "B2BHUB_DATA_DIR",
                        "B2BHUB_PAYLOAD_DIR")}
    hub = Proc("hub-here", [str(BIN / "b2bhub"), "run"], env, tmp_path / "hub-here.log",
               cwd=run_dir)
    procs.procs.append(hub)
    hub.wait_in_log(" ready.", timeout=90)
    hub.wait_in_log("beat: schedule open, agent running", timeout=90)
    data = (run_dir / "var").resolve()
    assert f"transport:   sqla+sqlite:///{data}/broker.sqlite" in hub.output()
    wait_until(lambda: (data / "broker.sqlite").exists(), 30, "the broker in ./var")
    time.sleep(2)  # a heartbeat and a scheduler tick of every child
    assert "no such table" not in hub.output(), hub.output()[-3000:]
    assert not (Path(b2bhub.__file__).parent / "var").exists()
