"""The declarative base, plain SQLAlchemy, so the engine can use the models without Flask."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import JSON, BigInteger, Integer, MetaData
from sqlalchemy.orm import DeclarativeBase

# Named constraints so that Alembic migrations work the same on SQLite and PostgreSQL.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: an auto-incrementing 64-bit key that SQLite also numbers (it only does so for INTEGER)
BigId = BigInteger().with_variant(Integer(), "sqlite")


class FakeClockOffset:
    """The seconds to add to this process's clock, read from a file now and then: the
    fault suite's and the clock-driven tests' way to step one process's clock forward
    or back where the system clock cannot be moved (``B2BHUB_FAKE_CLOCK_FILE=PATH``,
    read again at most every 0.2 s; missing or empty is 0)."""

    every = 0.2

    def __init__(self, path: str):
        self.path = path
        self._read_at = -1.0
        self._seconds = 0.0

    def seconds(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= self.every:
            self._read_at = now
            try:
                with open(self.path, encoding="ascii") as fh:
                    self._seconds = float(fh.read().strip() or 0)
            except (OSError, ValueError):
                self._seconds = 0.0
        return self._seconds


_clock_file = os.environ.get("B2BHUB_FAKE_CLOCK_FILE", "")
#: this process's clock offset, None (one test in utcnow) unless the variable is set
fake_clock = FakeClockOffset(_clock_file) if _clock_file else None


def utcnow() -> datetime:
    """Naive UTC: every time column holds UTC without a zone, on both databases.
    Shifted by the fault suite's fake clock only where ``B2BHUB_FAKE_CLOCK_FILE`` is
    set (:class:`FakeClockOffset`)."""
    now = datetime.now(UTC).replace(tzinfo=None)
    if fake_clock is not None:
        now += timedelta(seconds=fake_clock.seconds())
    return now


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict: JSON, list: JSON}
