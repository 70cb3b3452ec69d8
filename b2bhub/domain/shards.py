"""The shards of one scheduled source's scan (docs/design.md, "One poller's scan split
across workers").

A scheduled source whose configuration sets ``scan_shards`` to ``n > 1`` is scanned as
``n`` shards, each under a lease of its own: shard ``k`` owns the files whose recorded
relative path has ``crc32(path) % n == k``. The hash is of the path alone, the same in
every process and across restarts, so a file never changes shard while ``n`` stays.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

#: the most shards a source may be split into (``scan_shards``)
MOST_SHARDS = 64


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``; ``Shard(0, 1)`` is the whole source."""

    index: int = 0
    count: int = 1

    def owns(self, relative: str) -> bool:
        """True when the file recorded at ``relative`` (its relative path as text)
        belongs to this shard."""
        return self.count == 1 or shard_of(relative, self.count) == self.index

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count}"


WHOLE = Shard()


def shard_of(relative: str, count: int) -> int:
    """The index of the shard of ``count`` that owns the path ``relative``."""
    return zlib.crc32(relative.encode("utf-8", "surrogateescape")) % count


def shard_count(config: dict[str, Any] | None) -> int:
    """How many shards an instance's configuration asks for (1 when it says nothing)."""
    try:
        count = int((config or {}).get("scan_shards") or 1)
    except (TypeError, ValueError):
        return 1
    return min(max(count, 1), MOST_SHARDS)
