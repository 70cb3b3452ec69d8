"""A source's payload as the payload store reads it at intake (:mod:`b2bhub.engine.intake`).

The store reads a source's file or stream once, in chunks, to hash and keep it. What
passes through that read is what the message's inspection (``b2bhub.engine.inspection``)
needs, so for a small payload (at most :data:`HELD`, the store's own chunk: one read) the
bytes are held and inspected from memory instead of the stored copy being opened, its
sha256 checked and read again (from an object store: downloaded again). A larger
payload is not held (memory stays one chunk) and is inspected from the store as before.

Measured before (bench/RESULTS.md, "The same after the checks at intake and the
acknowledgments were merged"): of the 1,324 more samples a profile of two workers took
with inspection on (``python bench/edi_files.py --backend embedded --files 6000 --size
2048 --workers 2 --rounds 1 --profile DIR``), 184 were the second open and sha256 pass of
the stored copy. After: "Inspection from the bytes the intake read" there (8.5% on
PostgreSQL against the 15% goal).
"""

from __future__ import annotations

from typing import IO, Protocol

#: the largest payload whose bytes are held for its inspection: the payload store's
#: chunk, so a file that fits is read in one piece and held as that piece
HELD = 1 << 20


class _Fence(Protocol):
    def keep_alive(self) -> None: ...


class StagingRead:
    """A binary stream over a source's payload that keeps the scan's lease alive while
    a long one is read (``fence.keep_alive`` before each read) and holds the bytes of a
    payload of at most :data:`HELD` read to its end (:meth:`held`)."""

    def __init__(self, stream: IO[bytes], fence: _Fence):
        self._stream, self._fence = stream, fence
        self._parts: list[bytes] | None = []
        self._size, self._ended = 0, False

    def read(self, size: int = -1) -> bytes:
        self._fence.keep_alive()
        data = self._stream.read(size)
        if not data:
            self._ended = True
        elif self._parts is not None:
            self._size += len(data)
            if self._size > HELD:
                self._parts = None  # too large to hold: inspected from the store
            else:
                self._parts.append(bytes(data))
        return data

    def fileno(self) -> int:
        """The file's descriptor, for a store that takes the file by a hard link (it
        still reads the stream through :meth:`read` to hash it)."""
        return self._stream.fileno()

    def held(self, size: int) -> bytes | None:
        """The payload's bytes if it was read to its end, is small enough to have been
        held, and is ``size`` bytes long (what the store recorded); else None."""
        if not self._ended or self._parts is None or self._size != size:
            return None
        return b"".join(self._parts)
