"""``echo_intake``: ``POST /echo/<instance>`` takes a body from a partner named by its
``echo`` profile (headers ``Echo-From`` and ``Echo-Secret``, ``Echo-To`` our
organization), stores it as a message, records an ``echo_receipts`` row and answers with
the message id and the body. The ``echo`` profile kind holds the partner's Echo ID and
its shared secret (never shown again); the job ``echo_tally`` marks the receipts seen."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from sqlalchemy import update

from b2bhub.plugin import (
    PARTNER,
    EndpointReply,
    EndpointRequest,
    Field,
    NewMessage,
    NotFound,
    PeriodicJob,
    Plugin,
    ProfileKind,
    ServiceError,
    delete_protocol_profile,
    find_protocol_profile,
    get_protocol_profile,
    save_protocol_profile,
    store_and_dispatch_many,
)

KIND = "echo"


class EchoProfiles(ProfileKind):
    kind = KIND
    label = "Echo"

    def __init__(self) -> None:
        self.schema = [Field("echo_id", "string", required=True, help="the partner's Echo ID"),
                       Field("secret", "secret", help="the shared secret it sends")]

    def _row(self, session, party_kind: str, name: str, need: bool = True):
        row = get_protocol_profile(session, KIND, party_kind, name)  # NotFound: no party
        if row is None and need:
            raise NotFound(f"{party_kind} '{name}' has no Echo profile")
        return row

    def get(self, session, party_kind, name):
        row = self._row(session, party_kind, name)
        return {"party": name, "kind": party_kind, "echo_id": row.address,
                "has_secret": bool(row.settings.get("secret"))}

    def save(self, session, party_kind, name, body):
        row = self._row(session, party_kind, name, need=False)
        echo_id = (body.get("echo_id") or (row.address if row else "") or "").strip()
        if not echo_id:
            raise ServiceError("an Echo profile needs its echo_id", {"echo_id": "required"})
        settings = dict(row.settings) if row else {}
        if body.get("secret"):
            settings["secret"] = hashlib.sha256(body["secret"].encode()).hexdigest()
        save_protocol_profile(session, KIND, party_kind, name, echo_id, settings)
        return self.get(session, party_kind, name)

    def delete(self, session, party_kind, name):
        self._row(session, party_kind, name)
        delete_protocol_profile(session, KIND, party_kind, name)

    def describe(self, profile):
        return f"Echo ID {profile['echo_id']}"


ECHO_PROFILES = EchoProfiles()


def _plain(status: int, text: str) -> EndpointReply:
    return EndpointReply(status, {"Content-Type": "text/plain"}, text.encode() + b"\n")


def _tally(session, store, now) -> int:
    from b2bhub_echo.models import EchoReceipt
    done = session.execute(update(EchoReceipt).where(EchoReceipt.tallied_at.is_(None))
                           .values(tallied_at=now)).rowcount
    return done


class EchoIntake(Plugin):
    type_name = "echo_intake"
    roles = frozenset({"source"})
    description = "Takes a body at POST /echo/<instance> and answers it back."
    config_schema = [Field("max_size", "integer", default=1024 * 1024, min=1)]
    endpoint_prefix = "echo"
    endpoint_label = "echo intake"
    profile_kinds = (ECHO_PROFILES,)
    periodic_jobs = (PeriodicJob("echo_tally", _tally, every=60.0),)
    migrations = str(Path(__file__).with_name("migrations"))

    @classmethod
    def handle_request(cls, request: EndpointRequest) -> EndpointReply:
        from b2bhub_echo.models import EchoReceipt
        headers = {k.lower(): v for k, v in request.headers}
        session = request.session
        row = find_protocol_profile(session, KIND, address=headers.get("echo-from", ""),
                                    kind=PARTNER)
        secret = hashlib.sha256(headers.get("echo-secret", "").encode()).hexdigest()
        if row is None or not hmac.compare_digest(secret, row.settings.get("secret") or ""):
            return _plain(403, "unknown Echo-From or wrong Echo-Secret")
        body = request.read()
        if body is None:
            return _plain(413, f"over the size limit of {request.max_size} bytes")
        batch = request.store.batch()
        stored = batch.put(body)
        batch.commit()
        [message_id] = store_and_dispatch_many(session, [NewMessage(
            source=request.instance, from_party=row.party,
            to_party=headers.get("echo-to", ""), stages={"raw": (stored.digest, stored.size)},
            external_id=headers.get("echo-id"))], request.now)
        session.add(EchoReceipt(instance=request.instance, message_id=message_id,
                                echo_id=headers.get("echo-from"), received_at=request.now))
        session.commit()
        return EndpointReply(200, {"Content-Type": "application/octet-stream",
                                   "Echo-Message": str(message_id)}, body)
