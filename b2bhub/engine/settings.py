"""Delivery settings (System > Settings), stored in the settings table with defaults."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, fields, replace

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from b2bhub.models import Setting

KEY = "delivery"
#: replaced by every change of a party's protocol profiles (their per-process caches)
PROFILES_VERSION_KEY = "profiles_version"


@dataclass(frozen=True)
class DeliverySettings:
    """``wake_delays``: seconds between the wake-ups of an unclaimed delivery; after
    ``stall_after`` wake-ups without a claim it is stalled (5 -> 10 s, 30 s, 2 min,
    10 min, 10 min: 22 min 40 s). ``scan_lease_seconds``: the lease of a scheduled
    source's scan, renewed at every batch it commits; a scan left by a process that died
    is handed on this long after its last renewal."""

    stall_after: int = 5
    wake_delays: tuple[int, ...] = (10, 30, 120, 600, 600)
    lease_seconds: int = 300
    scan_lease_seconds: int = 30
    claim_batch_max: int = 16
    drain_seconds: float = 20.0
    probe_interval: int = 60
    cleanup_time: str = "03:30"
    retention_days: int = 30

    def wake_delay(self, wakes_so_far: int) -> int:
        """Seconds until the next wake-up after the ``wakes_so_far``-th one."""
        index = min(max(wakes_so_far, 1), len(self.wake_delays)) - 1
        return self.wake_delays[index]

    @classmethod
    def from_dict(cls, data: dict | None) -> DeliverySettings:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (data or {}).items() if k in known}
        if "wake_delays" in values:
            values["wake_delays"] = tuple(int(v) for v in values["wake_delays"])
        return replace(cls(), **values)

    def to_dict(self) -> dict:
        return asdict(self)


def load_settings(session: Session) -> DeliverySettings:
    return DeliverySettings.from_dict(
        session.scalar(select(Setting.value).where(Setting.key == KEY)))


def save_settings(session: Session, settings: DeliverySettings) -> None:
    row = session.get(Setting, KEY) or Setting(key=KEY)
    row.value = settings.to_dict()
    session.add(row)


def bump_version(session: Session, key: str) -> None:
    """Give the version setting ``key`` a fresh random token, in the caller's transaction
    (call it in the transaction that changes what the version stands for). A token, never
    a counter: something read inside a transaction that then rolled back is cached under a
    token no commit will ever store, so it can never pass for what a later commit made (a
    counter would reach the same number again)."""
    token = uuid.uuid4().hex
    changed = session.execute(update(Setting).where(Setting.key == key).values(value=token)
                              .execution_options(synchronize_session=False)).rowcount
    if not changed:
        session.add(Setting(key=key, value=token))
