"""Run by the django-pyas2 virtualenv's Python (bench/djpyas2.py makes it), never by the
project's: the partnership django-pyas2 receives the bench's messages on, and what it
stored of them afterwards.

    python djpyas2_admin.py setup DIR   # DIR holds hub.pem, hub.key, acme.pem
    python djpyas2_admin.py stored      # JSON: message id -> [status, sha256 of payload]

``DJANGO_SETTINGS_MODULE`` and ``PYTHONPATH`` name the settings bench/djpyas2.py wrote.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import django

django.setup()

from pyas2.models import (  # noqa: E402
    Message,
    Organization,
    Partner,
    PrivateKey,
    PublicCertificate,
)


def setup(folder: Path) -> None:
    """The hub's side as a django-pyas2 Organization (AS2 id HUB, its key and certificate
    for decryption and signing the MDN) and ACME as its Partner (its certificate to
    verify the signature; sha256, AES-256, a signed sync MDN), as the hub and bare
    pyas2lib are set up in bench/as2_receive.py."""
    hub = (folder / "hub.key").read_bytes() + (folder / "hub.pem").read_bytes()
    key = PrivateKey(name="hub.bench", key=hub, key_pass="")
    key.save()
    Organization.objects.create(name="mycompany", as2_name="HUB", encryption_key=key,
                                signature_key=key)
    cert = PublicCertificate(name="acme.bench", certificate=(folder / "acme.pem").read_bytes(),
                             verify_cert=False)  # self-signed, as validate_certs=False
    cert.save()
    Partner.objects.create(name="acme", as2_name="ACME", target_url="http://127.0.0.1:9/as2",
                           content_type="application/EDI-X12", encryption="aes_256_cbc",
                           encryption_cert=cert, signature="sha256", signature_cert=cert,
                           mdn=True, mdn_mode="SYNC", mdn_sign="sha256")


def stored() -> None:
    """Every inbound message: its status and the sha256 of the payload kept."""
    out = {}
    for message in Message.objects.filter(direction="IN"):
        with message.payload.open("rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        out[message.message_id] = [message.status, digest]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        setup(Path(sys.argv[2]))
    elif sys.argv[1] == "stored":
        stored()
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
