"""A certificate upload whose fields are not text is refused with the reason, never a
500 (found by tests/test_api_fuzz.py: a PKCS#12 with a number for its password)."""

from __future__ import annotations

import pytest

from plugins.as2.plugin import As2Receiver, As2Sender


@pytest.mark.parametrize("upload, reason", [
    ({"pkcs12": "AAAA", "password": 5}, "the certificate's password must be text"),
    ({"pem": 5}, "the certificate's pem must be text"),
    ({"pkcs12": ["x"]}, "the certificate's pkcs12 must be text"),
    ({"pem": "-----BEGIN CERTIFICATE-----", "private_key_pem": {}},
     "the certificate's private_key_pem must be text"),
])
def test_a_certificate_field_that_is_not_text_is_refused(api, hub, registry, upload,
                                                         reason):
    registry.register(As2Receiver)
    registry.register(As2Sender)
    hub.parties(organizations=("mycompany",), partners=("acme",))
    answer = api.put("/api/v1/partners/acme/profiles/as2",
                     json={"as2_id": "ACME", "certificate": upload})
    assert answer.status_code == 400, answer.get_data(as_text=True)
    assert answer.get_json()["error"]["message"] == reason
    assert api.get("/api/v1/partners/acme/profiles/as2").status_code == 404  # nothing kept
