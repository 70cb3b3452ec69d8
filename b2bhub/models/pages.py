"""Keyset pagination: a page of rows after a key, and the key to ask for the next page.

Keyset rather than offset pages: a row inserted while a client pages through a list
neither repeats a row nor hides one, and the cost of a page does not grow with its depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute, Session


@dataclass
class Page:
    """Rows of one page; ``next_key`` is None on the last page."""

    items: list[Any]
    next_key: Any = None


def keyset_page(session: Session, stmt: Select, key: InstrumentedAttribute, limit: int,
                after: Any = None, descending: bool = False) -> Page:
    """Up to ``limit`` rows of ``stmt`` ordered by the unique column ``key``, starting
    after the key value ``after``; newest first when ``descending``."""
    if after is not None:
        stmt = stmt.where(key < after if descending else key > after)
    stmt = stmt.order_by(key.desc() if descending else key.asc()).limit(limit + 1)
    rows = list(session.scalars(stmt))
    if len(rows) <= limit:
        return Page(rows)
    rows = rows[:limit]
    return Page(rows, getattr(rows[-1], key.key))
