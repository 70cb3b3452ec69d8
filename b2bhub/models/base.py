"""The declarative base, plain SQLAlchemy, so the engine can use the models without Flask."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import JSON, BigInteger, Integer, MetaData
from sqlalchemy.orm import DeclarativeBase

from b2bhub.runtime.faults import fake_clock

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


def utcnow() -> datetime:
    """Naive UTC: every time column holds UTC without a zone, on both databases.
    Shifted by the fault suite's fake clock only where ``B2BHUB_FAKE_CLOCK_FILE`` is
    set (:mod:`b2bhub.runtime.faults`)."""
    now = datetime.now(UTC).replace(tzinfo=None)
    if fake_clock is not None:
        now += timedelta(seconds=fake_clock.seconds())
    return now


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict: JSON, list: JSON}
