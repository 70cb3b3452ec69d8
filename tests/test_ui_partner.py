"""The partner page (``/ui/parties/<name>``): what an operator opens when a partner
calls. Its messages both ways, how the last day's deliveries went, its last receipt, its
profiles and certificates, and the open alerts about it; every query bounded."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import event, select

from b2bhub.config.extensions import db
from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.history import add_line, raise_alert
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import Certificate, Party, PluginInstance, ProtocolProfile, utcnow
from b2bhub.services import partner
from plugins.as2.plugin import As2Receiver, As2Sender
from tests import test_ui

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
setup = test_ui.setup


def rows_of(page: str, table: str) -> str:
    return re.search(rf'<table id="{table}">.*?</table>', page, re.S).group(0)


def a_partners_day(hub, session):
    """acme: two delivered in the last day (10 s and 30 s), one failed, one on its way,
    one delivered two days ago; globex: one failed, which is not acme's."""
    session.scalar(select(PluginInstance).where(PluginInstance.name == "writer_a")
                   ).max_concurrent_deliveries = 10  # all settled at once below
    session.commit()
    now = utcnow()
    seen = {"old": hub.message(now=now - timedelta(days=2), filename="old.edi"),
            "quick": hub.message(now=now - timedelta(seconds=10), filename="quick.edi"),
            "slow": hub.message(from_party="mycompany", to_party="acme",
                                now=now - timedelta(seconds=30), filename="slow.edi"),
            "broken": hub.message(now=now - timedelta(seconds=5), filename="broken.edi"),
            "other": hub.message(from_party="globex", filename="globex.edi",
                                 now=now - timedelta(seconds=1))}
    outcomes = {"old": (Outcome.delivered(), now - timedelta(days=2, seconds=-5)),
                "quick": (Outcome.delivered(), now), "slow": (Outcome.delivered(), now),
                "broken": (Outcome.failed("partner disk full"), now),
                "other": (Outcome.failed("globex is down"), now)}
    claims = {c.message_id: c for c in claiming.claim(session, "writer_a", "w1", now, 50, 300)}
    for name, (outcome, at) in outcomes.items():
        settlement.settle(session, claims[seen[name].id], outcome, RetryPolicy(), at)
    session.commit()
    seen["waiting"] = hub.message(to_party="acme", from_party="mycompany",
                                  filename="waiting.edi")
    return {**seen, "now": now}


def test_the_partner_page_shows_its_messages_both_ways_and_the_days_figures(
        setup, login, session):
    seen = a_partners_day(setup, session)
    page = login("viewer").get("/ui/parties/acme")
    assert page.status_code == 200
    messages = rows_of(page.text, "messages")
    for name in ("old", "quick", "slow", "broken", "waiting"):
        assert f'data-id="{seen[name].id}"' in messages, name
    assert f'data-id="{seen["other"].id}"' not in messages
    assert "globex.edi" not in messages
    ids = [int(i) for i in re.findall(r'<tr data-id="(\d+)"', messages)]
    assert ids == sorted(ids, reverse=True)
    assert "writer_a: partner disk full" in messages  # the reason, as on the list
    day = re.search(r'<div class="cards" id="day">.*?</div>\s*</div>', page.text, re.S).group(0)
    figures = dict(re.findall(r'id="([a-z-]+)"><div class="n">([^<]*)</div>', day))
    assert figures == {"success-rate": "67 %", "delivered": "2", "failed": "1",
                       "pending": "1", "latency": "10.0 s"}
    assert "p95 30.0 s" in day


def test_the_figures_of_the_day(setup, session):
    seen = a_partners_day(setup, session)
    day = partner.day_figures(session, "acme", seen["now"])
    assert (day.delivered, day.failed, day.pending) == (2, 1, 1)
    assert (day.median_seconds, day.p95_seconds) == (10.0, 30.0)
    assert round(day.success_rate, 3) == 0.667 and not day.capped
    nobody = partner.day_figures(session, "initech", seen["now"])
    assert (nobody.delivered, nobody.success_rate, nobody.median_seconds) == (0, None, None)


def test_the_last_receipt_the_certificates_and_the_open_alerts(setup, login, session,
                                                               registry):
    registry.register(As2Receiver)
    registry.register(As2Sender)
    seen = a_partners_day(setup, session)
    now = seen["now"]
    add_line(session, seen["slow"].id, "mdn_received",
             "writer_a: MDN processed, MIC matches", now=now)
    acme = session.scalar(select(Party).where(Party.name == "acme"))
    profile = ProtocolProfile(party_id=acme.id, protocol="as2", address="ACME")
    session.add(profile)
    session.flush()
    session.add_all([
        Certificate(profile_id=profile.id, usage="encryption", pem="-", subject="CN=old.acme",
                    issuer="CN=acme ca", not_after=now + timedelta(days=12)),
        Certificate(profile_id=profile.id, usage="signing", pem="-", subject="CN=new.acme",
                    issuer="CN=acme ca", not_after=now + timedelta(days=400))])
    raise_alert(session, "certificate_expiring", "certificate:acme:1",
                "the AS2 certificate of acme (CN=old.acme) expires soon", now=now)
    raise_alert(session, "certificate_expiring", "certificate:globex:2",
                "the AS2 certificate of globex expires soon", now=now)
    session.commit()
    page = login("viewer").get("/ui/parties/acme").text
    receipt = re.search(r'<p id="last-receipt">(.*?)</p>', page, re.S).group(1)
    assert "MDN processed, MIC matches" in receipt
    assert f'/ui/messages/{seen["slow"].id}#line-' in receipt
    assert re.search(r'<td><a href="/ui/parties/partner/acme/as2">AS2</a></td><td>ACME</td>',
                     page)
    certificates = rows_of(page, "party-certificates")
    ending = re.search(r'<tr class="expiring">.*?</tr>', certificates, re.S).group(0)
    assert "CN=old.acme" in ending and "ends within 30 days" in ending
    assert certificates.count('class="expiring"') == 1  # the one of 400 days is not flagged
    alerts = rows_of(page, "party-alerts")
    assert "the AS2 certificate of acme (CN=old.acme) expires soon" in alerts
    assert "message_failed" in alerts and "globex" not in alerts
    assert f'/ui/messages/{seen["broken"].id}' in alerts


def test_the_partner_page_is_linked_from_the_parties_list_and_from_messages(
        setup, login, session):
    message = setup.message()
    client = login("viewer")
    assert '<a href="/ui/parties/acme">acme</a>' in client.get("/ui/parties").text
    listed = client.get("/ui/messages").text
    assert '<td><a href="/ui/parties/acme">acme</a></td>' in listed
    shown = client.get(f"/ui/messages/{message.id}").text
    assert '<a href="/ui/parties/acme">acme</a> → <a href="/ui/parties/mycompany">' in shown
    assert client.get("/ui/parties/nobody").status_code == 404
    assert "Partner acme" in client.get("/ui/parties/acme").text


def test_each_query_of_the_page_is_bounded(setup, session):
    seen = a_partners_day(setup, session)
    statements: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        statements.append(" ".join(statement.split()))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        ids = partner.newest_ids(session, "acme")
        partner.recent_messages(session, "acme")
        partner.day_figures(session, "acme", seen["now"])
        partner.last_receipt(session, ids)
        partner.certificates(session, 1, seen["now"])
        partner.open_alerts(session, "acme", ids)
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    selects = [s for s in statements if s.startswith("SELECT")]
    assert len(selects) >= 10
    for statement in selects:  # a LIMIT, or one row of an aggregate over an index range
        assert " LIMIT " in statement or statement.startswith(
            "SELECT min(messages.id) AS min_1 FROM messages WHERE messages.created_at >="
        ), statement
