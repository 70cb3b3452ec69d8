"""Capability URLs for receipts by callback, and idempotency keys (SPEC 8, 9 http_poster).

A target that hands its destination a way to report the result later (an HTTP
destination answering 202) puts a callback URL in its request:
``<public URL>/callbacks/<token>``. The token is ``<delivery id>.<attempt>.<mac>``, the
MAC an HMAC-SHA256 under the hub's secret key over the delivery id and the attempt
(base64url, 256 bits). It is verified by recomputing it, so nothing is stored, and it
cannot be guessed or made for another delivery or attempt without the secret key. It
is good for the attempt it was made for only: a later attempt of the same delivery
(a retry, a redeliver) gets a new one, and the callback view refuses one whose attempt is
not the delivery's current attempt. Changing the secret key voids every token given out.

The idempotency key of a delivery is ``b2bhub-<delivery id>-<16 hex digits>``, the
digits an HMAC of the delivery id under the same key: the same on every attempt of the
delivery (including Send again and Redeliver: it is the same delivery), different for
every delivery, and different between two hubs whose delivery ids overlap.
Plain Python: no Flask.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass


@dataclass(frozen=True)
class CallbackTokens:
    """Makes and checks the callback tokens of one hub (its secret key and public URL)."""

    secret: str
    public_url: str

    def token(self, delivery_id: int, attempt: int) -> str:
        return f"{delivery_id}.{attempt}.{self._mac('receipt', delivery_id, attempt)}"

    def url(self, delivery_id: int, attempt: int) -> str:
        return f"{self.public_url.rstrip('/')}/callbacks/{self.token(delivery_id, attempt)}"

    def parse(self, token: str) -> tuple[int, int] | None:
        """(delivery id, attempt) of a genuine token, None for any other text."""
        parts = token.split(".")
        if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) < 19
                                        for p in parts[:2]):
            return None
        delivery_id, attempt = int(parts[0]), int(parts[1])
        expected = self._mac("receipt", delivery_id, attempt)
        if not hmac.compare_digest(expected.encode(), parts[2].encode("utf-8", "replace")):
            return None
        return delivery_id, attempt

    def idempotency_key(self, delivery_id: int) -> str:
        return f"b2bhub-{delivery_id}-{self._mac('idempotency', delivery_id)[:16]}"

    def _mac(self, purpose: str, *values: int) -> str:
        text = ":".join([purpose, *map(str, values)]).encode()
        digest = hmac.new(self.secret.encode(), text, hashlib.sha256).digest()
        if purpose == "idempotency":
            return digest.hex()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def receipt_ref(attempt: int) -> str:
    """The receipt reference recorded with a delivery awaiting a callback: the attempt
    whose token may settle it."""
    return f"callback-{attempt}"
