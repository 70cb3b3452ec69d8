"""What a file source took, recorded in the transaction that stored it (DESIGN "Sources")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from b2bhub.models.base import Base, BigId, utcnow


class PollerPickup(Base):
    """A file stored as a message whose removal is not yet confirmed.

    Written with the message; deleted once the file is gone. A row still there at the
    next scan means the process died between the commit and the removal: a file still
    matching it (path, size, mtime, sha256) is removed instead of being stored again.
    """

    __tablename__ = "poller_pickups"
    __table_args__ = (UniqueConstraint("instance", "path", "size", "mtime_ns", "sha256",
                                       name="uq_poller_pickups_file"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(1024))  # relative to the base directory
    size: Mapped[int] = mapped_column(BigInteger)
    mtime_ns: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    message_id: Mapped[int] = mapped_column(BigId)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
