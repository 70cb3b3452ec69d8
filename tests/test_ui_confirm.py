"""Every delete and every bulk action in the web UI asks first, on a page that works
without JavaScript: the link (GET) or the list's own POST only shows the question; the
confirm page's form, posted as it is (CSRF token and all), is what acts."""

from __future__ import annotations

import html
import re

import pytest
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import Delivery, HistoryLine, Party, PluginInstance, Route, utcnow
from tests import test_ui
from tests.test_ui_as2 import PARTNER, as2_types, pairs, partner_form, post, upload  # noqa: F401

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
setup = test_ui.setup


@pytest.fixture
def csrf(app):
    """``csrf()``: CSRF checked from now on, as in production (after the login), so the
    confirm page must carry its own token."""
    yield lambda: app.config.update(WTF_CSRF_ENABLED=True)
    app.config["WTF_CSRF_ENABLED"] = False


def confirm_form(page: str) -> dict[str, list[str]]:
    """The fields the confirm page's form posts, as a browser would send them."""
    form = re.search(r'<section class="confirm".*?<form method="post" action="([^"]+)"(.*?)'
                     r'</form>', page, re.S)
    assert form, page
    fields: dict[str, list[str]] = {"_action": [html.unescape(form.group(1))]}
    for name, value in re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"',
                                  form.group(2)):
        fields.setdefault(name, []).append(html.unescape(value))
    return fields


def asks_then_acts(client, url: str, question: str, gone) -> None:
    """GET and an unconfirmed POST ask and change nothing; the confirm form acts."""
    asked = client.get(url)
    assert asked.status_code == 200
    assert question in html.unescape(asked.text)
    fields = confirm_form(asked.text)
    assert fields["confirm"] == ["yes"] and fields["csrf_token"][0]
    assert fields.pop("_action") == [url]
    unconfirmed = client.post(url, data={"csrf_token": fields["csrf_token"][0]})
    assert unconfirmed.status_code == 200 and question in html.unescape(unconfirmed.text)
    assert not gone(), f"{url} acted without its confirmation"
    done = client.post(url, data=fields)
    assert done.status_code == 302, done.text
    assert gone()


def test_each_delete_asks_first_and_only_the_confirmed_post_deletes(
        setup, login, session, csrf):
    client = login("admin", "ada")
    csrf()
    hub = setup
    hub.instance("spare", "recorder", config={"record_dir": "/tmp"})
    hub.route("inbox", "*", "acme", "spare")
    route_id = session.scalar(select(Route.id).where(Route.target == "spare"))

    def exists(model, *where):
        session.expire_all()
        return session.scalar(select(model).where(*where)) is not None

    asks_then_acts(client, f"/ui/routes/{route_id}/delete",
                   f"Delete route {route_id}: inbox, * -> acme, spare?",
                   lambda: not exists(Route, Route.id == route_id))
    asks_then_acts(client, "/ui/plugins/spare/delete", "Delete recorder instance spare?",
                   lambda: not exists(PluginInstance, PluginInstance.name == "spare"))
    from b2bhub.services.config import create_party
    create_party(session, "partner", "initech")
    session.commit()
    asks_then_acts(client, "/ui/parties/partner/initech/delete", "Delete partner initech?",
                   lambda: not exists(Party, Party.name == "initech"))
    texts = session.scalars(select(HistoryLine.text).where(
        HistoryLine.type == "config_changed", HistoryLine.actor == "ada")).all()
    assert texts == [f"ada: deleted route {route_id}", "ada: deleted instance spare",
                     "ada: deleted partner initech"]


def test_the_list_pages_offer_delete_as_a_link_to_its_question(setup, login):
    client = login("admin")
    for page, link in (("/ui/routes", "/ui/routes/1/delete"),
                       ("/ui/plugins", "/ui/plugins/writer_a/delete"),
                       ("/ui/parties", "/ui/parties/partner/acme/delete")):
        text = client.get(page).text
        assert f'<a class="button danger" href="{link}">Delete…</a>' in text, page
        assert f'action="{link}"' not in text  # no form that deletes on one click


def test_a_refused_delete_says_why_after_the_confirmation(setup, login, session):
    client = login("admin")
    refused = client.post("/ui/plugins/writer_a/delete", data={"confirm": "yes"},
                          follow_redirects=True)
    assert "instance &#39;writer_a&#39; is used by route 1" in refused.text
    assert session.scalar(select(PluginInstance).where(PluginInstance.name == "writer_a"))


def test_a_viewer_is_not_even_asked(setup, login):
    client = login("viewer")
    for url in ("/ui/routes/1/delete", "/ui/plugins/writer_a/delete",
                "/ui/parties/partner/acme/delete"):
        assert client.get(url).status_code == 403, url
        assert client.post(url, data={"confirm": "yes"}).status_code == 403, url


def test_deleting_a_profile_asks_first(setup, login, session, pairs, csrf):  # noqa: F811
    from b2bhub.models import ProtocolProfile
    client = login("admin", "ada")
    csrf()
    token = test_ui.csrf_token(client.get(PARTNER).text)
    saved = post(client, PARTNER, partner_form(
        csrf_token=token, certificate_file=upload(pairs["acme"][0].encode(), "acme.pem")))
    assert saved.status_code == 302, saved.text
    assert "Delete AS2 profile…" in client.get(PARTNER).text
    asks_then_acts(client, PARTNER + "/delete", "Delete the AS2 profile of partner acme?",
                   lambda: session.scalar(select(ProtocolProfile)) is None)


def test_bulk_redeliver_asks_with_the_count_and_carries_the_selection(
        setup, login, session, csrf):
    hub = setup
    ids = [hub.message().deliveries[0].id for _ in range(3)]
    now = utcnow()
    for claim in claiming.claim(session, "writer_a", "w1", now, 10, 300):
        settlement.settle(session, claim, Outcome.failed("no disk"), RetryPolicy(), now)
    session.commit()
    client = login("operator", "olga")
    csrf()
    token = test_ui.csrf_token(client.get("/ui/delivery-errors").text)

    def states() -> list[str]:
        session.expire_all()
        return [session.get(Delivery, i).state for i in ids]

    asked = client.post("/ui/delivery-errors/redeliver", data={
        "csrf_token": token, "delivery": ids[:2], "target": "writer_a"})
    assert asked.status_code == 200
    assert "Redeliver the 2 selected deliveries?" in asked.text
    assert states() == ["failed"] * 3
    fields = confirm_form(asked.text)
    assert fields.pop("_action") == ["/ui/delivery-errors/redeliver"]
    assert fields["delivery"] == [str(i) for i in ids[:2]] and fields["target"] == ["writer_a"]
    done = client.post("/ui/delivery-errors/redeliver", data=fields, follow_redirects=True)
    assert "2 deliveries queued again" in done.text
    assert states() == ["queued", "queued", "failed"]

    everything = client.post("/ui/delivery-errors/redeliver", data={
        "csrf_token": token, "all_matching": "y"})
    assert "Redeliver all 1 delivery matching the filter?" in everything.text
    assert states() == ["queued", "queued", "failed"]
