"""A Python client generated from the served OpenAPI document (openapi-python-client, as
docs/api.md says to) lists messages and redelivers a failed delivery on a hub served on
loopback: the document is one a client can be generated from and used with, and its
operations are the ones a user would call (``list_messages``, ``redeliver_delivery``)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import requests
from sqlalchemy import select

from b2bhub.domain.outcome import Outcome
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine import machine
from b2bhub.models import Delivery, HistoryLine, utcnow
from b2bhub.services.tokens import new_token


def generate_client(served: str, where) -> object:
    """The client package generated from the document the hub serves, imported."""
    where.mkdir()
    document = where / "openapi.json"
    document.write_bytes(requests.get(served + "/api/v1/openapi.json", timeout=30).content)
    config = where / "generator.yaml"
    config.write_text("post_hooks: []\n")  # no formatter run: the code is used as written
    subprocess.run([sys.executable, "-m", "openapi_python_client", "generate",
                    "--path", str(document), "--meta", "none", "--config", str(config),
                    "--output-path", str(where / "b2bhub_client"), "--fail-on-warning"],
                   check=True, capture_output=True, timeout=300)
    sys.path.insert(0, str(where))
    try:
        return importlib.import_module("b2bhub_client")
    finally:
        sys.path.remove(str(where))


def test_a_generated_client_lists_messages_and_redelivers_one(served, hub, session,
                                                              record_dir, tmp_path):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    hub.instance("inbox", "manual_source")
    hub.instance("writer", "recorder", config={"record_dir": str(record_dir)})
    hub.route("inbox", "*", "*", "writer")
    message = hub.message()
    [claim] = machine.claim(session, "writer", "w1", utcnow(), 1, 300)
    machine.settle(session, claim, Outcome.failed("the disk is full"), RetryPolicy(), utcnow())
    _row, token = new_token(session, "ops-client", "operator")
    session.commit()

    package = generate_client(served, tmp_path / "generated")
    from b2bhub_client import AuthenticatedClient
    from b2bhub_client.api.deliveries import list_deliveries, redeliver_delivery
    from b2bhub_client.api.messages import list_messages
    from b2bhub_client.models import ActionResult, DeliveryPage, MessagePage

    assert package.__name__ == "b2bhub_client"
    client = AuthenticatedClient(base_url=served, token=token)
    page = list_messages.sync(client=client, limit=10, status="error")
    assert isinstance(page, MessagePage)
    assert [m.id for m in page.items] == [message.id] and page.next_cursor is None
    assert page.items[0].from_ == "acme" and page.items[0].status == "error"

    deliveries = list_deliveries.sync(client=client, message=message.id)
    assert isinstance(deliveries, DeliveryPage)
    [delivery] = deliveries.items
    assert delivery.state == "failed"
    result = redeliver_delivery.sync(delivery_id=delivery.id, client=client)
    assert isinstance(result, ActionResult)
    assert result.changed and result.deliveries == [delivery.id]

    session.expire_all()
    assert session.get(Delivery, delivery.id).state == "queued"
    asked = session.scalars(select(HistoryLine.text).where(
        HistoryLine.delivery_id == delivery.id, HistoryLine.type == "redeliver_requested",
        HistoryLine.actor == "ops-client")).all()
    assert asked == ["ops-client asked to redeliver the delivery to writer"]
    # a refusal comes back as the document's Error, not an exception or a guess
    again = redeliver_delivery.sync_detailed(delivery_id=delivery.id, client=client)
    assert again.status_code == 409 and again.parsed.error.code == "action_refused"
