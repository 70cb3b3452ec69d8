"""Which payload store a process uses, and the interface every store offers.

``B2BHUB_PAYLOAD_URL`` chooses: ``s3://bucket/prefix`` is the S3-compatible object store
(:mod:`b2bhub.payloads.s3`; credentials and region from the standard AWS variables, an
S3-compatible server's address from ``B2BHUB_S3_ENDPOINT_URL``); a filesystem path or a
``file://`` URL is the filesystem store (:mod:`b2bhub.payloads.store`) there; unset, the
filesystem store in ``B2BHUB_PAYLOAD_DIR`` (default ``<data dir>/payloads``).

The filesystem store is for one host (or hosts sharing a disk); the object store for
processes on hosts without a shared disk (web, workers and beat on a platform whose
every process has a disk of its own, lost at a restart).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import unquote, urlsplit

from b2bhub.payloads.store import PayloadStore, StoredPayload, VerifiedReader

__all__ = ["PayloadBackend", "PayloadBatchLike", "open_payload_store"]


class PayloadBatchLike(Protocol):
    """Payloads stored together; none under its digest before :meth:`commit`."""

    def __len__(self) -> int: ...

    def put(self, data: bytes | BinaryIO, chunk_size: int = ...,
            link: str | Path | None = None) -> StoredPayload: ...

    def drop(self, stored: StoredPayload) -> None: ...

    def commit(self) -> None: ...

    def discard(self) -> None: ...


class PayloadBackend(Protocol):
    """What the hub asks of a payload store (both stores offer exactly this)."""

    def put(self, data: bytes | BinaryIO, chunk_size: int = ...) -> StoredPayload: ...

    def batch(self) -> PayloadBatchLike: ...

    def open(self, digest: str) -> VerifiedReader: ...

    #: whether :meth:`read_ahead` may fetch anything (False: it always returns {})
    reads_ahead: bool

    def read_ahead(self, wanted: dict[str, int]) -> dict[str, bytes]:
        """The bytes of some of the ``wanted`` payloads ({digest: size as recorded}),
        fetched together: {digest: bytes}, not checked against the digest (hand them
        out through a :class:`VerifiedReader`). What is left out (too large, past the
        store's memory for it, failed, or a store with nothing to gain) is read with
        :meth:`open` as ever, which reports a missing or corrupt payload."""
        ...

    def exists(self, digest: str) -> bool: ...

    def size(self, digest: str) -> int: ...

    def iter_digests(self) -> Iterator[str]: ...

    def remove_stale_temp(self, older_than_seconds: float = ...) -> int: ...

    # the nightly cleanup's (b2bhub.engine.cleanup)
    def walk(self) -> Iterator[tuple[str, int, float]]: ...

    def older_than(self, digest: str, seconds: float) -> bool: ...

    def remove_unreferenced(self, digest: str, is_referenced: Callable[[str], bool],
                            cutoff: float) -> int | None: ...


def open_payload_store(url: str | None, directory: str | Path,
                       endpoint_url: str | None = None) -> PayloadBackend:
    """The store ``url`` names (module docstring), else the filesystem store in
    ``directory``. A URL of another scheme is refused with the variable's name."""
    if not url:
        return PayloadStore(directory)
    parts = urlsplit(url)
    if parts.scheme == "s3":
        from b2bhub.payloads.s3 import S3PayloadStore

        if not parts.netloc:
            raise ValueError(f"B2BHUB_PAYLOAD_URL={url!r} names no bucket "
                             "(s3://bucket/prefix)")
        return S3PayloadStore.from_url(url, endpoint_url=endpoint_url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"B2BHUB_PAYLOAD_URL={url!r}: a file:// URL names a path "
                             "on this host (file:///path)")
        return PayloadStore(unquote(parts.path))
    if parts.scheme == "" or (len(parts.scheme) == 1 and url[1:3] in (":\\", ":/")):
        return PayloadStore(url)
    raise ValueError(f"B2BHUB_PAYLOAD_URL={url!r}: expected s3://bucket/prefix, "
                     "file:///path or a path")
