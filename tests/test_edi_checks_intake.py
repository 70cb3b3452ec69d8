"""Checks at intake with real processes (docs/edi.md): pollers in a worker take dropped
interchanges; each envelope error the inspectors name makes the message Refused with the
error named where the source says ``edi_errors: refuse``, and Delivered with the error in
its history where it says ``accept``; an interchange received again is a duplicate
within ``duplicate_days`` of the worker's clock, and not after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import func, select

from b2bhub.models import Alert, Delivery, Message
from tests.procs import Processes, wait_until
from tests.test_e2e_files import drop, history, procs, rows  # noqa: F401
from tests.test_edi_inspect import EDIFACT_ERRORS, X12_ERRORS, edifact, x12

pytestmark = pytest.mark.processes

#: every envelope error the inspectors name: file name -> (interchange, error)
VARIANTS = {
    **{f"x12-{n}.edi": (change(x12()), error) for n, (change, error) in enumerate(X12_ERRORS)},
    **{f"edifact-{n}.edi": (change(edifact()), error)
       for n, (change, error) in enumerate(EDIFACT_ERRORS)},
    "edifact-une-control.edi": (edifact(ung=True).replace(b"UNE+2+9", b"UNE+2+8"),
                                "UNE 0048 8 does not match UNG 0048 9"),
    "edifact-une-count.edi": (edifact(ung=True).replace(b"UNE+2+9", b"UNE+1+9"),
                              "UNE says 1 messages"),
}


def load(procs: Processes, pollers: dict[str, dict], out: Path) -> None:  # noqa: F811
    """Parties, a poller per entry (``{to}/{filename}`` under ``in/<name>``, every
    second, with those instance fields), a file_writer and a route from each poller."""
    data = {"organizations": [{"name": "mycompany"}], "partners": [{"name": "acme"}],
            "plugins": [{"name": "writer", "type": "file_writer", "config": {
                "base_directory": str(out), "filename_pattern": "{source}/{original_filename}"}}],
            "routes": []}
    for name, fields in pollers.items():
        data["plugins"].append({"name": name, "type": "file_poller", **fields, "config": {
            "base_directory": str(procs.tmp / "in" / name), "path_pattern": "{to}/{filename}",
            "polling_interval": 1}})
        data["routes"].append({"source": name, "target": "writer"})
    path = procs.tmp / "fixtures.json"
    path.write_text(json.dumps(data))
    done = procs.cli("fixtures", "load", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def start(procs: Processes, env: dict | None = None) -> None:  # noqa: F811
    worker = procs.worker(env, wait=False)
    procs.beat(env)
    worker.wait_in_log(" ready.", timeout=60)


def messages(source: str) -> dict[str, tuple[int, str, str]]:
    """original file name -> (id, status, status text) of a source's messages."""
    return {name: (mid, status, text) for mid, name, status, text in rows(
        select(Message.id, Message.original_filename, Message.status, Message.status_text)
        .where(Message.source == source))}


def settled(source: str, count: int, what: str) -> dict[str, tuple[int, str, str]]:
    """The source's messages once ``count`` are there and none is on its way."""
    def done():
        found = messages(source)
        return len(found) == count and all(s in ("refused", "delivered")
                                           for _i, s, _t in found.values())
    wait_until(done, 90, what)
    return messages(source)


def test_every_envelope_error_is_refused_or_delivered_with_it_shown(procs, tmp_path):  # noqa: F811
    # duplicate_days 0: the variants share their control numbers, and are no duplicates
    load(procs, {"strict": {"edi_errors": "refuse", "duplicate_days": 0},
                 "lenient": {"duplicate_days": 0}}, tmp_path / "out")
    start(procs)
    files = {name: body for name, (body, _error) in VARIANTS.items()}
    drop(procs.tmp / "in" / "strict", {**files, "clean.edi": x12()})
    drop(procs.tmp / "in" / "lenient", files)

    strict = settled("strict", len(files) + 1, "the strict poller's messages settled")
    lenient = settled("lenient", len(files), "the lenient poller's messages settled")
    for name, (_body, error) in VARIANTS.items():
        message_id, status, text = strict[name]
        assert status == "refused" and text.startswith("envelope errors: "), (name, text)
        assert error in text, (name, text)
        assert any(t == "refused" and error in line for t, _a, line in history(message_id))
        message_id, status, _text = lenient[name]
        assert status == "delivered", name
        shown = [line for t, _a, line in history(message_id) if t == "edi_errors"]
        assert len(shown) == 1 and error in shown[0], (name, shown)
        assert "duplicate_received" not in [t for t, _a, _l in history(message_id)]
    assert strict["clean.edi"][1] == "delivered"
    # nothing of the refused ones went out; all the lenient ones did, byte for byte
    assert rows(select(func.count()).select_from(Delivery).join(Message).where(
        Message.source == "strict"))[0][0] == 1
    for name, (body, _error) in VARIANTS.items():
        assert (tmp_path / "out" / "lenient" / name).read_bytes() == body


def test_a_duplicate_interchange_by_the_worker_s_clock(procs, tmp_path):  # noqa: F811
    load(procs, {"alerting": {}, "refusing": {"duplicates": "refuse"}}, tmp_path / "out")
    clock = tmp_path / "clock-offset"
    clock.write_text("0")
    start(procs, {"B2BHUB_FAKE_CLOCK_FILE": str(clock)})
    po = x12(control="000000301")

    drop(procs.tmp / "in" / "alerting", {"first.edi": po})
    [(first, _s, _t)] = settled("alerting", 1, "the first copy delivered").values()
    drop(procs.tmp / "in" / "alerting", {"again.edi": po})
    again = settled("alerting", 2, "the second copy delivered")["again.edi"][0]
    said = (f"interchange 000000301 from ZZ:MYCOMPANY was received before as message "
            f"{first}")
    assert ("duplicate_received", said) in [(t, line) for t, _a, line in history(again)]
    assert rows(select(Alert.kind, Alert.message_id).where(
        Alert.subject == f"message:{again}", Alert.resolved_at.is_(None))) == [
        ("duplicate_received", again)]

    drop(procs.tmp / "in" / "refusing", {"copy.edi": po})
    [(copy, status, text)] = settled("refusing", 1, "the third copy refused").values()
    assert (status, text) == ("refused", f"duplicate: {said}")
    assert not rows(select(Alert.id).where(Alert.message_id == copy))

    # 31 days on by the worker's clock, the earlier copies are out of the window
    clock.write_text(str(31 * 86_400))
    drop(procs.tmp / "in" / "refusing", {"late.edi": po})
    late = settled("refusing", 2, "the late copy delivered")["late.edi"]
    assert late[1] == "delivered"
    assert "duplicate_received" not in [t for t, _a, _l in history(late[0])]
