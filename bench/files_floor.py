"""The physical floor of the files benchmark: the same work without the hub.

K processes (as many as the hub's workers) take the dropped files, in batches of 16
(the file writer's claim batch), and for each batch: read each file, write it to the
output directory (a temporary file, then renamed into place), make the batch durable
with one ``syncfs`` (an fsync per file where the system has none), remove the dropped
files, and INSERT one row per file and UPDATE it once in the same database, one commit
per batch. That is the cheapest honest way to move a file from one directory to another
with a durable record of it: what the hub does beyond it is its own overhead (the
payload store's copy, the routing, history, status, claims and leases, the broker).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchlib import run_together
from sqlalchemy import create_engine, text

from b2bhub.payloads.store import syncfs

BATCH = 16

_CREATE = {
    "postgresql": "CREATE TABLE IF NOT EXISTS floor_files (id bigserial PRIMARY KEY, "
                  "name text NOT NULL, state text NOT NULL, updated_at timestamp)",
    "sqlite": "CREATE TABLE IF NOT EXISTS floor_files (id INTEGER PRIMARY KEY, "
              "name TEXT NOT NULL, state TEXT NOT NULL, updated_at TIMESTAMP)",
}


def run_floor(database_url: str, inbox: Path, outbox: Path, workers: int) -> float:
    """Seconds K processes take to move every file of ``inbox`` to ``outbox``."""
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text(_CREATE[engine.dialect.name]))
        conn.execute(text("DELETE FROM floor_files"))
    engine.dispose()
    names = sorted(e.name for e in os.scandir(inbox) if e.is_file())
    outbox.mkdir(parents=True, exist_ok=True)
    start = run_together(_mover, [(database_url, str(inbox), str(outbox), names[i::workers])
                          for i in range(workers)])
    took = time.monotonic() - start
    moved = sum(1 for e in os.scandir(outbox) if e.is_file() and not e.name.startswith("."))
    if moved != len(names):
        raise RuntimeError(f"the floor moved {moved} of {len(names)} files")
    return took


def _mover(database_url: str, inbox: str, outbox: str, names: list[str], ready, go
           ) -> None:
    engine = create_engine(database_url)
    out_fd = os.open(outbox, os.O_RDONLY | os.O_DIRECTORY)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1")).all()
        conn.rollback()
        ready.release()
        go.wait()
        for first in range(0, len(names), BATCH):
            batch = names[first:first + BATCH]
            temps = []
            for name in batch:
                with open(os.path.join(inbox, name), "rb") as source:
                    data = source.read()
                tmp = os.path.join(outbox, f".floor-{name}.tmp")
                with open(tmp, "wb") as out:
                    out.write(data)
                temps.append((tmp, os.path.join(outbox, name)))
            if not syncfs(out_fd):  # no syncfs here: an fsync per file
                for tmp, _final in temps:
                    with open(tmp, "rb+") as written:
                        os.fsync(written.fileno())
            for tmp, final in temps:
                os.replace(tmp, final)
            os.fsync(out_fd)
            for name in batch:
                os.unlink(os.path.join(inbox, name))
            ids = [conn.execute(text("INSERT INTO floor_files (name, state) VALUES "
                                     "(:n, 'received') RETURNING id"), {"n": n}).scalar()
                   for n in batch]
            conn.execute(text("UPDATE floor_files SET state = 'delivered', "
                              "updated_at = CURRENT_TIMESTAMP WHERE id = :i"),
                         [{"i": i} for i in ids])
            conn.commit()
    os.close(out_fd)
    engine.dispose()

