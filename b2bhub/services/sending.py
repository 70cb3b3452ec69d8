"""Send Message by hand (SPEC 12; seed "Sending a message by hand")."""

from __future__ import annotations

from datetime import datetime
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.engine.dispatch import NewMessage, route_cache, store_and_dispatch
from b2bhub.models import ORGANIZATION, PARTNER, Message, Party
from b2bhub.payloads.store import PayloadStore
from b2bhub.services.config import get_instance
from b2bhub.services.errors import ServiceError

OPERATOR_SOURCE = "@operator"
MAX_BYTES = 64 * 1024 * 1024


def send_by_hand(session: Session, store: PayloadStore, registry, upload: BinaryIO,
                 filename: str, from_party: str, to_party: str, target: str | None,
                 actor: str, now: datetime) -> Message:
    """Store an uploaded file as a new message from ``@operator`` and deliver it to one
    target: the one given, or the one target the routes from sender to recipient name,
    whatever their source."""
    _check_parties(session, from_party, to_party)
    target = target or _target_from_routes(session, from_party, to_party)
    instance = get_instance(session, target)
    if not instance.enabled or instance.type not in registry or \
            "target" not in registry.get(instance.type).roles:
        raise ServiceError(N_("target: instance %(name)r is not an enabled target",
                              name=target),
                           {"target": "not an enabled target"})
    _check_size(upload)
    stored = store.put(upload)
    return store_and_dispatch(session, NewMessage(
        source=OPERATOR_SOURCE, from_party=from_party, to_party=to_party,
        stages={"unpacked": (stored.digest, stored.size)},
        original_filename=_bare_name(filename), actor=actor, targets=[target]), now)


def _check_size(upload: BinaryIO) -> None:
    """Refuse an oversize upload before anything of it is stored."""
    upload.seek(0, 2)
    size = upload.tell()
    upload.seek(0)
    if size > MAX_BYTES:
        raise ServiceError(N_("the file holds %(size)s bytes; at most %(most)s (64 MiB) "
                              "can be sent by hand", size=size, most=MAX_BYTES),
                           code="too_large")


def _check_parties(session: Session, from_party: str, to_party: str) -> None:
    kinds = dict(session.execute(select(Party.name, Party.kind).where(
        Party.name.in_([from_party, to_party]))).all())
    for field, name in (("from", from_party), ("to", to_party)):
        if name not in kinds:
            raise ServiceError(N_("%(field)s: no party named %(name)r", field=field,
                                  name=name), {field: "unknown party"})
    if {kinds[from_party], kinds[to_party]} != {ORGANIZATION, PARTNER}:
        text = N_("one of from and to must be an organization and the other a partner "
                  "(from an organization the message is outbound, from a partner inbound)")
        raise ServiceError(text, {"from": text, "to": text})


def _target_from_routes(session: Session, from_party: str, to_party: str) -> str:
    targets = sorted({r.target for r in route_cache.table(session).routes
                      if r.from_party in ("*", from_party) and r.to_party in ("*", to_party)})
    if len(targets) != 1:
        found = ", ".join(targets) if targets else "none"
        raise ServiceError(N_("choose a target: the routes from %(from_party)s to "
                              "%(to_party)s name %(found)s", from_party=from_party,
                              to_party=to_party, found=found),
                           {"target": "required"}, code="target_required")
    return targets[0]


def _bare_name(filename: str) -> str | None:
    name = filename.replace("\\", "/").rsplit("/", 1)[-1].strip()
    return name[:255] or None
