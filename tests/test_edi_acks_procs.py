"""Functional acknowledgments with real processes (docs/edi.md): interchanges dropped
for a file poller taking parties from their envelopes, a worker and beat making the
acknowledgments, routes for 997 and CONTRL sending them to the partner's file writer.
What the writer wrote is parsed back (pyx12, pydifact, our inspector)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from pydifact.segmentcollection import Interchange
from sqlalchemy import func, select

from b2bhub.engine.inspection import inspect_stream
from b2bhub.models import AckJob, HistoryLine, Message
from tests.procs import Processes, wait_until
from tests.test_e2e_files import drop, inbox, procs, rows  # noqa: F401
from tests.test_edi_acks_out import (  # noqa: F401
    GOOD_EDIFACT,
    INBOUND,
    inbound_x12,
    pyx12_maps,
    pyx12_valid,
    segments_of,
)

pytestmark = [pytest.mark.processes,
              pytest.mark.filterwarnings("ignore:segments.xml not found")]


def load(processes: Processes, directory: Path, out: Path) -> None:
    """mycompany (ZZ:MYCOMPANY); acme (ZZ:ACME) wants 997s, globex (ZZ:GLOBEX) none; a
    poller taking parties from the envelope (a file poller's own ``to`` is a partner:
    the directory's, replaced by the envelope's receiver); what partners send goes to ``erp``, the
    997s and CONTRLs to acme to ``acme_out``."""
    def writer(name: str) -> dict:
        return {"name": name, "type": "file_writer", "config": {
            "base_directory": str(out / name), "filename_pattern": "{original_filename}"}}

    data = {
        "organizations": [{"name": "mycompany", "edi_identities": ["ZZ:MYCOMPANY"]}],
        "partners": [{"name": "acme", "edi_identities": ["ZZ:ACME"],
                      "functional_acks": "997"},
                     {"name": "globex", "edi_identities": ["ZZ:GLOBEX"]}],
        "plugins": [{"name": "poller", "type": "file_poller", "parties_from": "envelope",
                     "config": {"base_directory": str(directory),
                                "path_pattern": "{to}/{filename}", "polling_interval": 1}},
                    writer("erp"), writer("acme_out")],
        "routes": [{"source": "poller", "from": "acme", "target": "erp"},
                   {"source": "poller", "from": "globex", "target": "erp"},
                   {"source": "poller", "from": "mycompany", "to": "acme",
                    "document_type": "997", "target": "acme_out"},
                   {"source": "poller", "from": "mycompany", "to": "acme",
                    "document_type": "CONTRL", "target": "acme_out"}]}
    path = processes.tmp / "fixtures.json"
    path.write_text(json.dumps(data))
    done = processes.cli("fixtures", "load", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def files_in(directory: Path) -> dict[str, bytes]:
    if not directory.exists():
        return {}
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if not name.startswith(".")}


def test_received_interchanges_get_their_acks_delivered_to_the_partner(
        procs, inbox, tmp_path, pyx12_maps):  # noqa: F811
    out = tmp_path / "out"
    load(procs, inbox, out)
    procs.worker()
    procs.beat()
    globex = INBOUND.replace(b"*ZZ*ACME           *", b"*ZZ*GLOBEX         *")
    drop(inbox, {"po.edi": INBOUND, "orders.edi": GOOD_EDIFACT, "globex.edi": globex},
         to="globex")  # the poller's own parties; the envelopes' stand
    wait_until(lambda: len(files_in(out / "erp")) == 3 and len(files_in(out / "acme_out"))
               == 2, 90, "the interchanges delivered and the two acks written")
    wait_until(lambda: rows(select(func.count()).select_from(AckJob))[0][0] == 0, 30,
               "no acknowledgment left to make")

    acks = files_in(out / "acme_out")
    assert sorted(acks) == ["997-000000001.edi", "contrl-000000001.edi"]
    ack = acks["997-000000001.edi"]
    assert pyx12_valid(pyx12_maps, ack)
    assert [s for s in segments_of(ack) if s[0] in ("AK1", "AK9")] == [
        ["AK1", "PO", "101"], ["AK9", "A", "1", "1", "1"]]
    env = inspect_stream(io.BytesIO(ack))
    assert (env.sender, env.receiver, env.control, env.types, env.errors) == (
        "ZZ:MYCOMPANY", "ZZ:ACME", "000000001", ["997"], [])
    contrl = Interchange.from_str(acks["contrl-000000001.edi"].decode())
    uci = next(s for s in contrl.segments if s.tag == "UCI")
    assert uci.elements == ["102", ["ACME", "ZZ"], ["MYCOMPANY", "ZZ"], "7"]

    made = dict(rows(select(Message.original_filename, Message.id)))
    texts = {name: [t for t, in rows(select(HistoryLine.text).where(
        HistoryLine.message_id == made[name], HistoryLine.type == "ack_generated"))]
        for name in ("po.edi", "orders.edi", "globex.edi")}
    assert texts == {
        "po.edi": [f"997 sent as message {made['997-000000001.edi']}: accepted"],
        "orders.edi": [f"CONTRL sent as message {made['contrl-000000001.edi']}: accepted"],
        "globex.edi": []}  # globex wants none


def test_two_workers_number_many_acks_uniquely(procs, inbox, tmp_path,  # noqa: F811
                                               app):
    out = tmp_path / "out"
    load(procs, inbox, out)
    n = 40
    drop(inbox, {f"po-{i:03d}.edi": inbound_x12(control=f"{i:09d}") for i in range(1, n + 1)},
         to="globex")  # the poller's own parties; the envelopes' stand
    first, second = procs.worker(), procs.worker()
    procs.beat()
    wait_until(lambda: rows(select(func.count()).select_from(Message))[0][0] >= n, 90,
               "every interchange stored")
    celery = app.extensions["celery"]
    for _ in range(4):  # both workers at it at once, beside beat's ticks
        celery.send_task("b2bhub.make_acks")
    wait_until(lambda: len(files_in(out / "acme_out")) == n, 120, "every ack written")

    numbers = sorted(segments_of(body)[0][13] for body in files_in(out / "acme_out").values())
    assert numbers == [f"{i:09d}" for i in range(1, n + 1)]  # distinct, none skipped
    assert rows(select(func.count()).select_from(Message))[0][0] == 2 * n  # none twice
    made = [int(line.split("acknowledgments: ")[1].split(" made")[0])
            for proc in (first, second) for line in proc.output().splitlines()
            if "functional acknowledgments: " in line]
    assert sum(made) == n
