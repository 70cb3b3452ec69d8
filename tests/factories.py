"""Factories that make rows through the same services the API and fixtures use."""

from __future__ import annotations

import time
from datetime import datetime

from b2bhub.engine.dispatch import NewMessage, store_and_dispatch
from b2bhub.models import utcnow
from b2bhub.services import config as svc


class Hub:
    def __init__(self, session, registry, app):
        self.session, self.registry, self.app = session, registry, app
        self.store = app.extensions["b2bhub.store"]

    def parties(self, organizations=("mycompany",), partners=("acme",)) -> None:
        for name in organizations:
            svc.create_party(self.session, "organization", name)
        for name in partners:
            svc.create_party(self.session, "partner", name)
        self.session.commit()

    def instance(self, name: str, type_: str, **data):
        row = svc.save_instance(self.session, self.registry, {"name": name, "type": type_,
                                                              **data})
        self.session.commit()
        return row

    def route(self, source: str, from_party: str, to_party: str, target: str):
        row = svc.create_route(self.session, self.registry, source, from_party, to_party,
                               target, actor="tests")
        self.session.commit()
        return row

    def message(self, source: str = "inbox", from_party: str = "acme",
                to_party: str = "mycompany", body: bytes = b"ISA*00*...~",
                now: datetime | None = None, filename: str = "order.edi", **kw):
        stored = self.store.put(body)
        message = store_and_dispatch(self.session, NewMessage(
            source=source, from_party=from_party, to_party=to_party,
            stages={"unpacked": (stored.digest, stored.size)}, original_filename=filename,
            **kw), now or utcnow())
        self.session.commit()
        return message


def digests_in(store) -> list[str]:
    """Every digest a payload store holds, as the nightly cleanup walks it."""
    return [digest for digest, _size, _age in store.walk()]


def sweep(store, referenced, older_than_seconds: float = 3600) -> int:
    """What the nightly cleanup (b2bhub.engine.cleanup) asks of a store when it removes
    orphans, with the reference check a set or predicate instead of the database: every
    walked payload older than the grace that is not referenced goes, then the stale
    temp files; how many went."""
    is_referenced = referenced if callable(referenced) else referenced.__contains__
    cutoff = getattr(store, "clock", time.time)() - older_than_seconds
    removed = sum(store.remove_unreferenced(digest, is_referenced, cutoff) is not None
                  for digest, _size, age in list(store.walk()) if age > older_than_seconds)
    return removed + store.remove_stale_temp(older_than_seconds)
