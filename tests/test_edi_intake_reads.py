"""What inspection at intake reads (b2bhub/engine/staging.py): a small payload is
inspected from the bytes the intake read while storing it, so an object store is not
asked for it again; a large one (past ``staging.HELD``) is read back from the store,
streamed. Either way its attributes are the same. Against an S3 server of our own that
records every request (``tests/s3_peer.py``)."""

from __future__ import annotations

import io
import os

import pytest
from sqlalchemy import select

from b2bhub.engine import staging
from b2bhub.engine.intake import SourceIntake
from b2bhub.models import MessageAttribute
from plugins.file_poller import LocalFile
from tests.enginekit import standard_hub
from tests.test_edi_inspect import X12, x12
from tests.test_payload_s3_requests import peer, peer_store  # noqa: F401

#: an interchange past what is held: 20,000 purchase orders
LARGE = x12([("850", f"{n:04d}", f"PO-{n}") for n in range(1, 20001)], control="000000301")


@pytest.fixture
def intake(hub, peer):  # noqa: F811
    standard_hub(hub)
    return SourceIntake(hub.session, peer_store(peer), "inbox")


def gets(peer) -> list[str]:  # noqa: F811
    return [seen.path for seen in peer.seen if seen.method == "GET"]


def attributes(session, message_id: int) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, value in session.execute(select(MessageAttribute.name, MessageAttribute.value)
                                       .where(MessageAttribute.message_id == message_id)):
        found.setdefault(name, []).append(value)
    return found


def test_the_large_sample_is_past_what_is_held():
    assert len(X12) < staging.HELD < len(LARGE)


def test_a_small_stream_is_inspected_without_asking_the_store_for_it(intake, peer, session):  # noqa: F811
    message_id = intake.store_and_dispatch(io.BytesIO(X12), "acme", "mycompany", "po.edi")

    assert gets(peer) == []
    found = attributes(session, message_id)
    assert (found["document_type"], found["reference"], found["interchange_control"]) == (
        ["850"], ["PO-4711"], ["000000101"])


def test_a_large_stream_is_read_back_from_the_store_once(intake, peer, session):  # noqa: F811
    message_id = intake.store_and_dispatch(io.BytesIO(LARGE), "acme", "mycompany", "big.edi")

    assert len(gets(peer)) == 1
    found = attributes(session, message_id)
    assert found["sets"] == ["20000"] and found["reference"][:2] == ["PO-1", "PO-2"]


def test_taken_files_small_and_large_alike_get_their_attributes(intake, peer, session,  # noqa: F811
                                                                  tmp_path):
    files = {"po.edi": X12, "big.edi": LARGE}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    for name in files:
        st = os.stat(tmp_path / name)
        assert intake.take_file(LocalFile(tmp_path, (name,), st.st_size, st.st_mtime_ns),
                                "acme", "mycompany", name)
    [small_id, large_id] = intake.flush()

    assert len(gets(peer)) == 1  # the large file's, after its batch was in place
    assert attributes(session, small_id)["reference"] == ["PO-4711"]
    assert attributes(session, large_id)["sets"] == ["20000"]
