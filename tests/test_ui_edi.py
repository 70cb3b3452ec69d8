"""The UI's envelope filters on Messages and the envelope table on a message's page
(docs/edi.md), through Flask's test client."""

from __future__ import annotations

import re

import pytest

from b2bhub.engine.inspection import attribute_rows
from b2bhub.services import envelope as envelope_module
from b2bhub.services import identities
from b2bhub.web import messages as messages_view
from tests.test_edi_inspect import EDIFACT, X12, x12
from tests.test_ui import fresh_user_per_request, login  # noqa: F401


@pytest.fixture(autouse=True)
def nothing_read_before():
    """Each test reads its payloads itself (the page keeps what it read by digest)."""
    envelope_module._cache.clear()


@pytest.fixture
def setup(hub, record_dir):
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    identities.set_identities(hub.session, _party(hub, "acme"), ["ZZ:ACME"])
    hub.session.commit()
    hub.instance("inbox", "manual_source")
    hub.instance("writer_a", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer_a")
    return hub


def _party(hub, name):
    from b2bhub.services.config import get_party
    return get_party(hub.session, "partner", name)


def edi_message(hub, body: bytes, filename: str, **kw):
    """A message whose envelope was read as intake reads it."""
    digest = hub.store.put(body).digest
    return hub.message(body=body, filename=filename, from_party="mycompany",
                       to_party="acme", rows=attribute_rows(hub.store, digest), **kw)


def listed(client, query: str) -> list[str]:
    page = client.get(f"/ui/messages?{query}")
    assert page.status_code == 200
    return re.findall(r"<td>([\w.-]+\.(?:edi|txt))</td>", page.text)


def test_messages_filter_by_envelope_and_keep_the_filters(setup, login, monkeypatch):  # noqa: F811
    po = edi_message(setup, X12, "po.edi")
    orders = edi_message(setup, EDIFACT, "orders.edi")
    two = edi_message(setup, x12(groups=[
        ("PO", "7", [("850", "0001", "PO-1")]), ("IN", "8", [("810", "0003", "INV-9")])],
        control="000000555"), "two.edi")
    setup.message(body=b"a note", filename="note.txt")
    client = login("viewer")

    assert sorted(listed(client, "document_type=850")) == ["po.edi", "two.edi"]
    assert listed(client, "document_type=810") == ["two.edi"]
    assert listed(client, "document_type=ORDERS:D:96A") == ["orders.edi"]
    assert listed(client, "reference=PO-4711") == ["po.edi"]
    assert listed(client, "reference=PO-4712") == ["orders.edi"]
    assert listed(client, "document_type=850&reference=PO-4712") == []
    assert listed(client, "sender=ZZ:MYCOMPANY&interchange_control=000000555") == ["two.edi"]
    assert listed(client, "receiver=ZZ:ACME&group_control=8") == ["two.edi"]
    assert listed(client, "transaction_control=0003") == ["two.edi"]
    assert listed(client, "reference=+PO-4711+") == ["po.edi"]  # spaces typed around it

    # the values stay in the form; the disclosure is open when one of its filters is set
    page = client.get("/ui/messages?document_type=850&reference=PO-4711").text
    assert 'name="document_type" value="850"' in page
    assert 'name="reference" value="PO-4711"' in page
    assert '<details class="envelope">' in page
    page = client.get("/ui/messages?group_control=8").text
    assert '<details class="envelope" open>' in page and 'name="group_control" value="8"' in page

    # the live rows and the pager keep them
    rows = client.get(f"/ui/messages/rows?ids={po.id},{orders.id},{two.id}"
                      "&document_type=850").text
    assert f'data-id="{po.id}" data-match="1"' in rows
    assert f'data-id="{orders.id}" data-match="0"' in rows
    monkeypatch.setattr(messages_view, "PAGE_SIZE", 1)
    page = client.get("/ui/messages?document_type=850&sender=ZZ:MYCOMPANY").text
    live = re.search(r'data-live-rows="([^"]+)"', page).group(1)
    assert "document_type=850" in live and "sender=ZZ:MYCOMPANY" in live
    older = re.search(r'<a href="([^"]+)">older', page).group(1)
    assert "document_type=850" in older and "sender=ZZ:MYCOMPANY" in older
    assert listed(client, older.split("?", 1)[1].replace("&amp;", "&")) == ["po.edi"]


def test_the_api_and_the_list_find_the_same_messages(setup, login):  # noqa: F811
    edi_message(setup, X12, "po.edi")
    edi_message(setup, EDIFACT, "orders.edi")
    client = login("viewer")
    for query in ("document_type=850", "reference=PO-4712", "receiver=ZZ:ACME",
                  "interchange_control=102", "document_type=810"):
        api = client.get(f"/api/v1/messages?{query}").json["items"]
        assert sorted(m["original_filename"] for m in api) == sorted(listed(client, query))


def test_the_message_page_shows_the_envelope_as_a_table(setup, login):  # noqa: F811
    two = edi_message(setup, x12(groups=[
        ("PO", "7", [("850", "0001", "PO-1"), ("850", "0002", "PO-2")]),
        ("IN", "8", [("810", "0003", "INV-9")])], newline="\r\n"), "two.edi")
    client = login("viewer")
    page = client.get(f"/ui/messages/{two.id}").text
    table = section(page, "envelope")
    assert "X12 00401" in table
    assert "<code>ZZ:MYCOMPANY</code> <small class=\"muted\">(no party's EDI identity)" in table
    assert '<code>ZZ:ACME</code> — <a href="/ui/parties/acme">acme</a>' in table
    assert "000000101" in table and "2026-11-29 12:00" in table
    assert "element <code>*</code>, sub-element <code>&gt;</code>, segment <code>~</code>" in table
    assert "repetition" not in table  # ISA11 of 00401 is no separator
    assert "2 functional groups, 3 transaction sets" in table
    assert cells(section(page, "envelope-groups")) == [
        ["PO", "7", "004010", "2"], ["IN", "8", "004010", "1"]]
    assert cells(section(page, "envelope-sets")) == [
        ["850", "0001", "7", "PO-1"], ["850", "0002", "7", "PO-2"],
        ["810", "0003", "8", "INV-9"]]
    assert "envelope-errors" not in page


def test_an_edifact_interchange_s_messages(setup, login):  # noqa: F811
    orders = edi_message(setup, EDIFACT, "orders.edi")
    page = login("viewer").get(f"/ui/messages/{orders.id}").text
    table = section(page, "envelope")
    assert "EDIFACT UNOC:3" in table and "<code>ZZ:MYCOMPANY</code>" in table
    assert "release <code>?</code>" in table and "segment <code>&#39;</code>" in table
    assert "<h3>Messages</h3>" in page
    assert cells(section(page, "envelope-sets")) == [["ORDERS:D:96A", "1", "—", "PO-4712"]]


def test_envelope_errors_are_listed_at_the_top(setup, login):  # noqa: F811
    bad = edi_message(setup, X12.replace(b"SE*10*0001", b"SE*10*0009"), "bad.edi")
    page = login("viewer").get(f"/ui/messages/{bad.id}").text
    errors = section(page, "envelope-errors", "div")
    assert "Envelope errors (1)" in errors
    assert "<li>SE02 0009 does not match ST02 0001</li>" in errors
    assert page.index('id="envelope-errors"') < page.index('<dl class="props">')


def test_many_sets_are_cut_with_how_many_more(setup, login, monkeypatch):  # noqa: F811
    monkeypatch.setattr(envelope_module, "MAX_ROWS", 2)
    many = edi_message(setup, x12([("850", f"000{n}", f"PO-{n}") for n in range(1, 6)]),
                       "many.edi")
    page = login("viewer").get(f"/ui/messages/{many.id}").text
    sets = section(page, "envelope-sets")
    assert [row[1] for row in cells(sets)] == ["0001", "0002"]
    assert "and 3 more transaction sets" in sets
    assert "5 transaction sets" in section(page, "envelope")


def test_a_large_payload_shows_the_flat_summary(setup, login, monkeypatch):  # noqa: F811
    """Above the size the page reads again: what intake kept, and why no more."""
    monkeypatch.setattr(envelope_module, "MAX_READ", 100)
    two = edi_message(setup, x12(groups=[
        ("PO", "7", [("850", "0001", "PO-1")]), ("IN", "8", [("810", "0003", "INV-9")])]),
        "two.edi")
    page = login("viewer").get(f"/ui/messages/{two.id}").text
    table = section(page, "envelope")
    assert '<a href="/ui/parties/acme">acme</a>' in table
    for value in ("PO, IN", "7, 8", "850, 810", "0001, 0003", "PO-1, INV-9"):
        assert value in table
    assert "envelope-sets" not in page
    assert "larger than the 0 MiB the page reads again" in section(page, "envelope-flat", "p")


def test_a_message_without_an_envelope_shows_nothing_of_one(setup, login):  # noqa: F811
    plain = setup.message(body=b"just text", filename="note.txt")
    page = login("viewer").get(f"/ui/messages/{plain.id}").text
    assert 'id="envelope' not in page and "Envelope" not in page.split("<main", 1)[1]


def section(page: str, element_id: str, tag: str = "table") -> str:
    found = re.search(rf'<{tag}[^>]* id="{element_id}"[^>]*>.*?</{tag}>', page, re.S)
    assert found, f"no {tag} #{element_id}"
    return found.group(0)


def cells(table: str) -> list[list[str]]:
    body = table.split("<tbody>", 1)[1]
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
