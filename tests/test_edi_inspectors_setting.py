"""The operator chooses which document inspectors run: ``B2BHUB_INSPECTORS``
(docs/configuration.md, docs/edi.md). Unset, every registered one; empty, none
(inspection off); a name that is no installed inspector stops the process at start."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from b2bhub import create_app
from b2bhub.config import environment
from b2bhub.models import Message, MessageAttribute
from b2bhub.plugin.registry import InspectorsSettingError, get_inspectors
from tests.procs import wait_until
from tests.test_e2e_files import drop, inbox, load_fixtures, procs, rows  # noqa: F401
from tests.test_edi_inspect import EDIFACT, X12, inspect


@pytest.mark.parametrize("value,names,chosen", [
    (None, None, ["edifact", "x12"]), ("", (), []), (" , ", (), []),
    ("x12", ("x12",), ["x12"]), ("x12, edifact,x12", ("x12", "edifact"), ["edifact", "x12"]),
])
def test_the_setting_chooses_among_the_registered_inspectors(monkeypatch, value, names,
                                                             chosen):
    if value is None:
        monkeypatch.delenv("B2BHUB_INSPECTORS", raising=False)
    else:
        monkeypatch.setenv("B2BHUB_INSPECTORS", value)
    assert environment.inspector_names() == names
    assert list(get_inspectors()) == chosen  # in name order, the order they are tried
    assert (inspect(X12) is not None) == ("x12" in chosen)
    assert (inspect(EDIFACT) is not None) == ("edifact" in chosen)


def test_an_unknown_inspector_is_refused_at_start_naming_the_known_ones(
        monkeypatch, backend, tmp_path):
    monkeypatch.setenv("B2BHUB_INSPECTORS", "x12,x13")
    with pytest.raises(InspectorsSettingError) as refused:
        create_app({"DATA_DIR": str(tmp_path / "data"),
                    "SQLALCHEMY_DATABASE_URI": backend["database_url"],
                    "BROKER_URL": backend["broker_url"]}, serve_http=False)
    assert str(refused.value) == (
        "B2BHUB_INSPECTORS names 'x13', which is not an installed inspector; known "
        "inspectors: edifact, x12 (unset: all of them; empty: none)")
    monkeypatch.delenv("B2BHUB_INSPECTORS")
    assert list(get_inspectors()) == ["edifact", "x12"]


def attributes_of(name: str) -> list[tuple[str, str]]:
    return [tuple(r) for r in rows(
        select(MessageAttribute.name, MessageAttribute.value)
        .join(Message, Message.id == MessageAttribute.message_id)
        .where(Message.original_filename == name).order_by(MessageAttribute.id))]


def stored(*names: str) -> bool:
    return rows(select(func.count()).select_from(Message)
                .where(Message.original_filename.in_(names)))[0][0] == len(names)


@pytest.mark.processes
def test_a_worker_inspects_with_the_inspectors_its_setting_chooses(
        procs, inbox):  # noqa: F811
    load_fixtures(procs, inbox)
    procs.beat()
    off = procs.worker({"B2BHUB_INSPECTORS": ""})
    drop(inbox, {"off.edi": X12})
    wait_until(lambda: stored("off.edi"), 60, "off.edi stored")
    off.stop()
    assert attributes_of("off.edi") == []  # inspection off: stored, no envelope

    procs.worker({"B2BHUB_INSPECTORS": "x12"})
    drop(inbox, {"on.edi": X12, "orders.edi": EDIFACT})
    wait_until(lambda: stored("on.edi", "orders.edi"), 60, "on.edi and orders.edi stored")
    found = dict(attributes_of("on.edi"))
    assert (found["standard"], found["document_type"], found["reference"], found["sets"]) \
        == ("X12", "850", "PO-4711", "1")
    assert attributes_of("orders.edi") == []  # the edifact inspector was not chosen
    assert attributes_of("off.edi") == []  # read once, at intake: not read again


@pytest.mark.processes
def test_a_worker_with_an_unknown_inspector_does_not_start(procs):  # noqa: F811
    worker = procs.worker({"B2BHUB_INSPECTORS": "x13"}, wait=False)
    assert worker.wait_exit(60) not in (None, 0)
    assert ("B2BHUB_INSPECTORS names 'x13', which is not an installed inspector; known "
            "inspectors: edifact, x12") in worker.output()
