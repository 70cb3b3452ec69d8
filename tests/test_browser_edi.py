"""EDI in a real browser against a real hub on loopback (gunicorn, a worker and beat):
an admin gives a partner its EDI identities through the party's form (a malformed one
and one another party has are refused, the reason beside the field), a file poller
stores the X12 and EDIFACT samples, the Messages filters find each by document type
and by its PO number, and the message page shows the envelope as a table.
Screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import pytest

from tests import test_browser as kit
from tests.test_edi_inspect import EDIFACT, X12

pytestmark = pytest.mark.processes
hub_url, page_for, shot = kit.hub_url, kit.page_for, kit.shot
drop, wait_for_message = kit.drop, kit.wait_for_message


@pytest.fixture
def edi_inbox(hub, registry, tmp_path):
    """A file poller (``{to}/{filename}``) routed to a file writer."""
    from plugins.file_poller import FilePoller
    from plugins.file_writer import FileWriter

    for cls in (FilePoller, FileWriter):
        registry.register(cls)
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    inbox = tmp_path / "in"
    hub.instance("poller", "file_poller", config={
        "base_directory": str(inbox), "polling_interval": 1,
        "path_pattern": "{to}/{filename}"})
    hub.instance("writer", "file_writer", config={"base_directory": str(tmp_path / "out")})
    hub.route("poller", "*", "*", "writer")
    return inbox


def identities_field_error(page) -> str:
    return page.inner_text(".field.has-error:has(#edi_identities) .error")


def listed(page) -> list[str]:
    """The file names the Messages list shows."""
    return sorted(page.locator("#messages tbody tr td:nth-child(7)").all_inner_texts())


def filter_messages(page, **fields: str) -> None:
    page.goto("/ui/messages")
    for name, value in fields.items():
        locator = page.locator(f"form.filters input[name={name}]")
        if not locator.is_visible():
            page.click("form.filters details.envelope summary")
        locator.fill(value)
    page.click("form.filters button:has-text('Filter')")
    page.wait_for_load_state()


def test_identities_filters_and_the_envelope_table(browser, hub_url, edi_inbox):
    page = page_for(browser, hub_url, "ada")

    # our organization's identity, through its form
    page.goto("/ui/parties/organization/mycompany")
    page.fill("#edi_identities", "ZZ:MYCOMPANY")
    page.click("button:has-text('Save')")
    assert "Changed organization mycompany" in page.inner_text("main")

    # the partner's: a malformed one, then one that is mycompany's, are refused
    page.goto("/ui/parties/partner/acme")
    page.fill("#edi_identities", "ZZ:ACME\nZZ ACME")
    page.click("button:has-text('Save')")
    assert "ZZ ACME" in identities_field_error(page)
    assert page.input_value("#edi_identities") == "ZZ:ACME\nZZ ACME"  # kept as typed
    shot(page, "e1-party-identity-malformed")
    page.fill("#edi_identities", "ZZ:ACME\nZZ:MYCOMPANY")
    page.click("button:has-text('Save')")
    assert "ZZ:MYCOMPANY is already organization mycompany's" in identities_field_error(page)
    shot(page, "e2-party-identity-taken")
    page.fill("#edi_identities", "ZZ:ACME\n01:123456789")
    page.click("button:has-text('Save')")
    assert "Changed partner acme" in page.inner_text("main")
    page.goto("/ui/parties/acme")
    assert "EDI identities: ZZ:ACME, 01:123456789" in page.inner_text("#edi-identities")

    # real messages: the samples dropped where the poller looks
    drop(edi_inbox, "po-4711.edi", X12)
    drop(edi_inbox, "orders-4712.edi", EDIFACT)
    x12_id = wait_for_message("po-4711.edi")
    wait_for_message("orders-4712.edi")

    filter_messages(page, document_type="850")
    assert listed(page) == ["po-4711.edi"]
    assert page.input_value("form.filters input[name=document_type]") == "850"
    shot(page, "e3-messages-by-document-type")
    filter_messages(page, document_type="ORDERS:D:96A")
    assert listed(page) == ["orders-4712.edi"]
    filter_messages(page, reference="PO-4711")
    assert listed(page) == ["po-4711.edi"]
    filter_messages(page, reference="PO-4712")
    assert listed(page) == ["orders-4712.edi"]
    filter_messages(page, receiver="ZZ:ACME", interchange_control="102")
    assert listed(page) == ["orders-4712.edi"]
    assert page.locator("form.filters details.envelope[open]").count() == 1
    shot(page, "e4-messages-by-envelope")
    filter_messages(page, document_type="850", reference="PO-4712")
    assert listed(page) == []
    assert "No messages match." in page.inner_text("main")

    filter_messages(page, reference="PO-4711")
    page.click(f'#messages tr[data-id="{x12_id}"] a')
    page.wait_for_url(f"**/ui/messages/{x12_id}")
    envelope = page.locator("#envelope")
    assert envelope.locator("td[data-field=standard]").inner_text() == "X12 00401"
    assert envelope.locator("td[data-field=sender]").inner_text() == (
        "ZZ:MYCOMPANY — mycompany")
    assert envelope.locator("td[data-field=receiver]").inner_text() == "ZZ:ACME — acme"
    assert envelope.locator("td[data-field=control]").inner_text() == "000000101"
    assert envelope.locator("td[data-field=date]").inner_text() == "2026-11-29 12:00"
    groups = page.locator("#envelope-groups tbody tr td")
    assert groups.all_inner_texts() == ["PO", "101", "004010", "1"]
    cells = page.locator("#envelope-sets tbody tr td").all_inner_texts()
    assert cells == ["850", "0001", "101", "PO-4711"]
    assert page.locator("#envelope-errors").count() == 0
    shot(page, "e5-message-envelope")
    envelope.locator("td[data-field=receiver] a").click()
    page.wait_for_url("**/ui/parties/acme")

    # an interchange with an envelope error: named at the top of its page
    drop(edi_inbox, "po-4799.edi", X12.replace(b"SE*10*0001", b"SE*10*0009").replace(
        b"PO-4711", b"PO-4799"))
    bad_id = wait_for_message("po-4799.edi")
    filter_messages(page, reference="PO-4799")
    page.click(f'#messages tr[data-id="{bad_id}"] a')
    errors = page.inner_text("#envelope-errors")
    assert "Envelope errors (1)" in errors and "SE02 0009 does not match ST02 0001" in errors
    shot(page, "e6-message-envelope-error")
