"""Why a message failed, where the operator looks first: the messages list and Delivery
errors say the reason, and the message page leads from its Error to the delivery and the
history line that explain it."""

from __future__ import annotations

import html
import re

from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.machine import claiming, settlement
from b2bhub.models import HistoryLine, utcnow
from tests import test_ui

login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request
setup = test_ui.setup

LONG = "connection refused by 10.0.0.7:21 after 3 tries; " + "the partner's server said " * 20


def fail(hub, session, text: str):
    message = hub.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.failed(text), RetryPolicy(), now)
    session.commit()
    return message.id, message.deliveries[0].id


def row(page: str, attribute: str, value: int) -> str:
    found = re.search(rf'<tr {attribute}="{value}".*?</tr>', page, re.S)
    assert found, page
    return found.group(0)


def test_the_messages_list_says_why_a_message_failed(setup, login, session):
    failed, _ = fail(setup, session, "disk full")
    fine = setup.message().id
    client = login("viewer")
    page = client.get("/ui/messages").text
    assert "writer_a: disk full" in row(page, "data-id", failed)
    assert "why" not in row(page, "data-id", fine)
    live = client.get(f"/ui/messages/rows?ids={failed}").text  # the rows live updates fetch
    assert "writer_a: disk full" in live


def test_a_long_reason_is_shortened_and_kept_whole_in_its_title(setup, login, session):
    failed, delivery = fail(setup, session, LONG)
    client = login("viewer")
    cell = row(client.get("/ui/messages").text, "data-id", failed)
    shown = re.search(r'<small class="why" title="([^"]*)">([^<]*)</small>', cell)
    assert html.unescape(shown.group(1)) == LONG
    text = html.unescape(shown.group(2))
    assert text.endswith("…") and len(text) <= len("writer_a: ") + 90
    assert text.startswith("writer_a: connection refused by 10.0.0.7:21")
    errors = row(client.get("/ui/delivery-errors").text, "data-delivery", delivery)
    reason = re.search(r'<td class="why" title="([^"]*)">([^<]*)</td>', errors)
    assert html.unescape(reason.group(1)) == LONG
    text = html.unescape(reason.group(2))
    assert text.startswith("connection refused") and text.endswith("…") and len(text) == 120


def test_delivery_errors_say_the_reason_of_each(setup, login, session):
    _, delivery = fail(setup, session, "permission denied: /out/acme")
    page = login("viewer").get("/ui/delivery-errors").text
    assert "<th>Reason</th>" in page
    assert "permission denied: /out/acme" in row(page, "data-delivery", delivery)


def test_the_message_page_leads_from_error_to_the_delivery_and_its_history_line(
        setup, login, session):
    message_id, delivery = fail(setup, session, "disk full")
    page = login("viewer").get(f"/ui/messages/{message_id}").text
    line_id = session.scalar(select(HistoryLine.id).where(
        HistoryLine.delivery_id == delivery, HistoryLine.type == "delivery_changed")
        .order_by(HistoryLine.id.desc()).limit(1))
    title = re.search(r"<h1>.*?</h1>", page, re.S).group(0)
    assert f'<a href="#delivery-{delivery}"' in title and "Error" in title
    why = re.search(r'<p class="why" id="why">(.*?)</p>', page, re.S).group(1)
    assert "Why:</strong>" in why and "disk full" in why
    assert f'<a href="#delivery-{delivery}">the delivery to writer_a</a>' in why
    assert f'<a href="#line-{line_id}">its history line</a>' in why
    delivery_row = row(page, "data-delivery", delivery)
    assert f'id="delivery-{delivery}"' in delivery_row
    assert f'<a href="#line-{line_id}"' in delivery_row and "Failed" in delivery_row
    line = row(page, "data-line", line_id)
    assert f'id="line-{line_id}"' in line and "disk full" in line


def test_a_delivered_message_has_no_why(setup, login, session, record_dir):
    message = setup.message()
    now = utcnow()
    [claim] = claiming.claim(session, "writer_a", "w1", now, 1, 300)
    settlement.settle(session, claim, Outcome.delivered("written"), RetryPolicy(), now)
    session.commit()
    page = login("viewer").get(f"/ui/messages/{message.id}").text
    assert 'id="why"' not in page and "Delivered" in page
