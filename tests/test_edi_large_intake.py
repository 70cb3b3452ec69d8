"""A 100 MB interchange through a real worker (issue 38, "Must show"): a file poller
takes a generated X12 interchange of 100,000 transaction sets, the x12 inspector reads
its envelope as a stream, and the worker's peak resident memory rises by less than
100 MB while it does (docs/edi.md)."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import func, select

from b2bhub.engine.inspection import MAX_ROWS, attributes
from b2bhub.models import Message, MessageAttribute, Payload
from b2bhub.plugin import Envelope
from tests.procs import wait_until
from tests.test_e2e_files import drop, inbox, load_fixtures, procs, rows  # noqa: F401
from tests.test_edi_inspect import X12, write_big_x12

MB = 1024 * 1024


def peak_rss(pid: int) -> int:
    """The process's peak resident set size so far (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def attribute_counts(name: str) -> dict[str, int]:
    return dict(rows(select(MessageAttribute.name, func.count())
                     .join(Message, Message.id == MessageAttribute.message_id)
                     .where(Message.original_filename == name)
                     .group_by(MessageAttribute.name)))


def attribute(name: str, attribute_name: str) -> list[str]:
    return [r[0] for r in rows(
        select(MessageAttribute.value).join(Message, Message.id == MessageAttribute.message_id)
        .where(Message.original_filename == name, MessageAttribute.name == attribute_name)
        .order_by(MessageAttribute.id))]


@pytest.mark.processes
def test_a_100_mb_interchange_is_stored_and_inspected_in_under_100_mb_of_worker_memory(
        procs, inbox):  # noqa: F811
    load_fixtures(procs, inbox)
    worker = procs.worker()
    procs.beat()
    # a small interchange first: the worker's peak before the big one includes its
    # imports and an intake's usual working set
    drop(inbox, {"small.edi": X12})
    wait_until(lambda: attribute("small.edi", "sets") == ["1"], 60, "small.edi inspected")
    before = peak_rss(worker.pid)

    staging = inbox.parent / "staging"
    size = write_big_x12(staging / "big.edi", 100_000)
    assert size > 100_000_000
    os.rename(staging / "big.edi", inbox / "acme" / "big.edi")
    wait_until(lambda: attribute("big.edi", "sets"), 180, "big.edi stored and inspected")
    after = peak_rss(worker.pid)
    print(f"worker peak RSS {before / MB:.1f} MB before, {after / MB:.1f} MB after a "
          f"{size / 1e6:.1f} MB interchange")

    assert attribute("big.edi", "sets") == ["100000"]
    assert attribute("big.edi", "groups") == ["1"]
    assert attribute("big.edi", "document_type") == ["850"]
    assert attribute("big.edi", "interchange_control") == ["000000101"]
    counts = attribute_counts("big.edi")
    assert "edi_error" not in counts, attribute("big.edi", "edi_error")
    # the details of the first 10,000 sets (docs/edi.md); all of them counted
    assert counts["transaction_control"] == counts["reference"] == 10_000
    assert attribute("big.edi", "transaction_control")[-1] == "000010000"
    assert sum(counts.values()) == 20_011 <= MAX_ROWS
    [stored] = rows(select(Payload.size).join(Message, Message.id == Payload.message_id)
                    .where(Message.original_filename == "big.edi"))
    assert stored[0] == size
    assert after - before < 100 * MB, (
        f"the worker's peak RSS rose by {(after - before) / MB:.1f} MB taking a "
        f"{size / MB:.0f} MB interchange ({before / MB:.1f} -> {after / MB:.1f} MB)")


def test_envelope_errors_are_kept_when_the_sets_fill_the_rows():
    env = Envelope(standard="X12", sender="ZZ:A", receiver="ZZ:B", control="1")
    env.groups = [{"functional_id": "PO", "control": str(n)} for n in range(MAX_ROWS)]
    for n in range(Envelope.MAX_DETAILS + 5):
        env.add_set({"type": "850", "control": f"{n:09d}", "reference": f"PO-{n}"})
    env.error("the interchange has no IEA trailer")
    pairs = attributes(env)
    assert len(pairs) == MAX_ROWS
    assert pairs[-1] == ("edi_error", "the interchange has no IEA trailer")
    assert ("sets", str(Envelope.MAX_DETAILS + 5)) in pairs
