"""What a partner says it is (issue 42, item 1): the AS2-Version and EDIINT-Features of
its messages (else of its receipts) are kept on its AS2 profile, answered by the API and
shown on its AS2 page; what we send is on the wire test (tests/test_as2_interop.py:
AS2 1.2 and no claim of a feature we do not implement)."""

# ruff: noqa: F401, F811  (test_as2's fixtures, imported, are the tests' parameters)

from __future__ import annotations

import requests

from plugins.as2 import profiles
from tests import test_ui
from tests.test_as2 import DATA, as2, certs, partner

login = test_ui.login
PROFILE = "/api/v1/partners/acme/profiles/as2"


def post_plain(as2, message_id: str, **headers) -> None:
    answer = requests.post(as2.url, data=DATA, timeout=30, headers={
        "AS2-From": "ACME", "AS2-To": "HUB", "Message-ID": f"<{message_id}@acme>",
        "Content-Type": "application/edi-x12", **headers})
    assert answer.status_code == 200, answer.text


def test_the_partners_version_and_features_are_kept_and_shown(as2, api, login):
    profiles._PEER_SAID.clear()  # this process has heard nothing of acme yet
    assert api.get(PROFILE).json["peer_features"] is None
    # pyas2lib (so django-pyas2) sends AS2-Version 1.2 and EDIINT-Features: CMS
    as2.choose(sign=True, encrypt=True)
    assert as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                            mdn_signed=True)["mdn_status"] == "processed"
    said = api.get(PROFILE).json["peer_features"]
    assert {k: said[k] for k in ("as2_version", "features", "seen_in")} == {
        "as2_version": "1.2", "features": ["CMS"], "seen_in": "message"}
    first_seen = said["seen_at"]

    # the same again: nothing written (the time it was first heard stays)
    assert as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                            mdn_signed=True)["mdn_status"] == "processed"
    assert api.get(PROFILE).json["peer_features"]["seen_at"] == first_seen

    # the partner's product changed: what it says now is kept
    as2.choose(sign=False, encrypt=False, mdn_mode="none")
    post_plain(as2, "features-2", **{"AS2-Version": "1.1",
                                     "EDIINT-Features": "multiple-attachments, CEM"})
    said = api.get(PROFILE).json["peer_features"]
    assert (said["as2_version"], said["features"]) == ("1.1", ["multiple-attachments",
                                                               "CEM"])
    page = login("viewer").get("/ui/parties/partner/acme/as2").text
    assert "AS2-Version 1.1; EDIINT-Features multiple-attachments, CEM" in page
    assert "in its last message" in page


def test_a_partner_heard_only_through_its_receipts_is_known_by_them(as2, api):
    """We send, the partner answers with a sync MDN carrying AS2-Version (pyas2lib's
    answer does): kept, as heard in a receipt; a message of its own is kept over it."""
    profiles._PEER_SAID.clear()
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True)
    message = as2.outbound()
    as2.drain()
    assert as2.delivery(message.id).state == "delivered"
    said = api.get(PROFILE).json["peer_features"]
    assert said is not None and said["seen_in"] == "receipt", said
    assert said["as2_version"] == "1.2"
    as2.choose(sign=False, encrypt=False, mdn_mode="none")
    post_plain(as2, "features-3", **{"AS2-Version": "1.2"})
    said = api.get(PROFILE).json["peer_features"]
    assert (said["seen_in"], said["features"]) == ("message", [])
    # and the receipts that follow no longer overwrite what its messages said
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True)
    again = as2.outbound()
    as2.drain()
    assert as2.delivery(again.id).state == "delivered"
    assert api.get(PROFILE).json["peer_features"]["seen_in"] == "message"
