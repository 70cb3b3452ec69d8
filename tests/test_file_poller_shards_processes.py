"""A poller's scan split in two shards on two real worker processes (issue 43): one of
them is killed (SIGKILL) while its shard picks files up, and the other, the only one
left, takes the dead shard on once its lease has run out: every file is stored exactly
once. Processes as in ``test_e2e_files.py``: the test process only drops files, kills
a process and reads the outcome."""

from __future__ import annotations

import json
import random
import signal
import time

import pytest
from sqlalchemy import select

from b2bhub.domain.shards import shard_of
from b2bhub.engine.settings import DeliverySettings, save_settings
from b2bhub.models import Lock, Message, PollerPickup, utcnow
from tests.procs import Processes, wait_until
from tests.test_e2e_files import assert_stored_exactly_once, count, drop, left_in, rows

pytestmark = pytest.mark.processes

FILES = 1000  # about 500 a shard: five batches each


@pytest.fixture
def procs(backend, app, tmp_path):
    app.extensions["celery"].control.purge()
    processes = Processes(backend, tmp_path, app.config["PAYLOAD_DIR"])
    yield processes
    processes.stop_all()


def load_poller(procs: Processes, inbox) -> None:
    """mycompany, acme and a poller on ``inbox`` in two shards, scanned every second."""
    path = procs.tmp / "fixtures.json"
    path.write_text(json.dumps({
        "organizations": [{"name": "mycompany"}], "partners": [{"name": "acme"}],
        "plugins": [{"name": "poller", "type": "file_poller", "config": {
            "base_directory": str(inbox), "path_pattern": "{to}/{filename}",
            "polling_interval": 1, "scan_shards": 2}}]}))
    done = procs.cli("fixtures", "load", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def holders() -> dict[str, tuple[str, object]]:
    """The live shard leases: lock name -> (owner, until)."""
    now = utcnow()
    return {name: (owner, until) for name, owner, until in rows(
        select(Lock.name, Lock.owner, Lock.until).where(
            Lock.name.in_(["scan:poller#0", "scan:poller#1"]), Lock.owner.is_not(None)))
        if until > now}


def pid_of(owner: str) -> int:
    """The process id in a lease owner (``host:pid:...``, see engine/presence.py)."""
    return int(owner.split(":")[1])


def test_a_worker_killed_mid_batch_its_shard_is_taken_on_by_the_other(
        procs, session, tmp_path):
    save_settings(session, DeliverySettings(scan_lease_seconds=3))
    session.commit()
    inbox = tmp_path / "in"
    load_poller(procs, inbox)
    workers = [procs.worker(queues="default") for _ in range(2)]
    procs.beat()
    rng = random.Random(seed := random.randrange(1 << 30))
    print(f"random seed {seed}")
    files = {f"s-{i:04d}.edi": f"ISA*shard file {i}*".encode()
             + rng.randbytes(rng.randint(100, 2000)) for i in range(FILES)}
    shard = {name: shard_of(f"acme/{name}", 2) for name in files}
    drop(inbox, files)

    of_shard_0 = {name for name in files if shard[name] == 0}

    # Both workers scan shards: each is seen holding one. Seen over the run, not at one
    # instant: a scan releases its lease when it ends, so two held at once happens only
    # while both have files to take, and once the files are gone, hardly ever (CI saw
    # 90 s pass without it). Shard 0 is past its first batch with files still left.
    scanners: set[int] = set()

    def both_workers_scanning_and_shard_0_mid_way() -> bool:
        held = holders()
        scanners.update(pid_of(owner) for owner, _until in held.values())
        left_of_0 = len(of_shard_0 & set(left_in(inbox / "acme")))
        return scanners == {w.pid for w in workers} and 0 < left_of_0 < len(of_shard_0)
    wait_until(both_workers_scanning_and_shard_0_mid_way, 90,
               "both workers scanning shards, shard 0 past its first batch", every=0.01)
    time.sleep(rng.uniform(0, 0.5))  # into a later batch: staging, commit or removal
    wait_until(lambda: "scan:poller#0" in holders(), 30, "shard 0 scanning", every=0.005)
    owner, _until = holders()["scan:poller#0"]
    dead = next(w for w in workers if w.pid == pid_of(owner))
    dead.signal(signal.SIGKILL)
    killed_at = utcnow()
    assert dead.wait_exit(10) == -signal.SIGKILL
    live = next(w for w in workers if w is not dead)
    [(name, until)] = [(n, u) for n, o, u in rows(select(Lock.name, Lock.owner, Lock.until)
                                                  .where(Lock.owner == owner))]
    dead_shard = int(name[-1])
    left = [n for n in left_in(inbox / "acme") if shard.get(n) == dead_shard]
    print(f"killed {dead.name} holding {name} until {until}; {len(left)} of its files "
          f"left, {count(PollerPickup)} pickup rows, {count(Message)} messages")
    assert left, "the dead shard had taken all its files before the kill"

    def dead_shards_part() -> tuple[list, list, int]:
        """The dead shard's files on disk, its pickup rows and its stored messages."""
        return ([n for n in left_in(inbox / "acme") if shard.get(n) == dead_shard],
                sorted(p for (p,) in rows(select(PollerPickup.path))
                       if shard_of(p, 2) == dead_shard),
                sum(shard[f] == dead_shard for (f,) in rows(select(Message.original_filename))))

    # Until the dead worker's lease runs out nothing of its shard moves: not a file
    # stored, not one removed. The kill may fall between a batch's commit and its
    # removals (its files stored, pickup rows left, nothing more to store): then the
    # live worker only finishes those rows, and only after the lease.
    frozen = dead_shards_part()
    while True:
        seen = dead_shards_part()
        if utcnow() >= until:  # (read before this moment: still under the lease)
            break
        assert seen == frozen, "the dead shard moved while its lease still ran"
        time.sleep(0.05)

    wait_until(lambda: not left_in(inbox / "acme") and count(PollerPickup) == 0
               and count(Message) == FILES, 120, "every file stored")
    assert live.alive()
    assert_stored_exactly_once(procs, files)
    assert left_in(inbox) == ["acme"]
    # the dead shard's files stored after the kill, if any were left to store, were
    # stored by the live worker once the dead one's lease had run out
    after = [created for filename, created in rows(select(
        Message.original_filename, Message.created_at).where(Message.created_at > killed_at))
        if shard[filename] == dead_shard]
    assert all(created >= until for created in after), (after, until)
    assert after or frozen[1], "nothing was left to store, yet no pickup row to finish"
