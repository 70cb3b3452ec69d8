"""The payload store on an S3-compatible object store (``B2BHUB_PAYLOAD_URL=s3://...``).

Same contract as the filesystem store (:mod:`b2bhub.payloads.store`), so every caller works
with either: content-addressed (a payload is the object ``<prefix>/<sha256>``), the
sha256 checked at the end of every read (:class:`~b2bhub.payloads.store.VerifiedReader`),
written before the transaction that references it (``put`` and ``PayloadBatch.commit``
return only once the object is stored), streamed both ways, orphans removable.

Writing: the digest is only known once the payload has been read, so a payload up to
one part (``part_size``, 8 MiB) is read into memory, hashed and put under its digest in
one request; a larger one is uploaded as a multipart upload to a temporary key
``<prefix>/tmp/<ms since epoch>-<random>`` with its parts streamed (one part in memory
at a time, never the whole payload), then copied on the server to its digest's key and
the temporary object deleted. An object under a digest is therefore always complete:
S3 makes a put, a completed upload and a copy visible whole or not at all. Storing
content that is already there writes it again, which renews its age for the orphan
cleanup (the new reference gets its grace period, as a renewed mtime does on disk).

A batch holds its small payloads in memory until :meth:`S3PayloadBatch.commit` (at
most ``batch_memory`` bytes, 16 MiB; beyond that they go to temporary keys at once) and
puts them in parallel there: nothing is under its digest before the commit.

Reading: :meth:`S3PayloadStore.open` is one GetObject, its body streamed. That is a
round trip per payload, which a worker attempting a claimed batch of deliveries one
after the other would pay in series; so :meth:`S3PayloadStore.read_ahead` fetches the
payloads of a batch at once, in parallel on up to ``threads`` threads as a batch's
commit puts them: only those of at most ``read_ahead_size`` bytes (1 MiB) each, at most
``batch_memory`` bytes in all, each whole in memory. An object whose GetObject fails
(missing, refused, unreachable) or whose length is not the size recorded for it is
left out, and the ordinary :meth:`~S3PayloadStore.open` of it reports the error as
ever; what is read ahead is handed out through a
:class:`~b2bhub.payloads.store.VerifiedReader` all the same, so its sha256 is still checked.

A process killed in the middle leaves at most a temporary object or an unfinished
multipart upload (its parts), never an object under a digest that no row may reference
yet: :meth:`S3PayloadStore.remove_stale_temp`, which the nightly cleanup and the file
poller run, deletes temporary objects and aborts multipart uploads older than their
margin. Their age
comes from the time in their key (some S3-compatible servers report no real start time
for an upload); the age of a stored payload is its ``LastModified``.

The file poller's ``take_by_link`` (a hard link into the store) only exists on the
filesystem: here a payload offered by a link is copied like any other.

No Flask, no Celery, no SQLAlchemy. boto3 is the S3 client (credentials, regions,
retries, signing and the managed multipart copy beyond 5 GB are its business, and done
better than we would); a client is made per process, as boto3's clients must not cross
a fork.

The two requests every message makes, the PutObject of a payload held in memory (at
intake, and a batch's move to a temporary key) and the GetObject of a payload (``open``,
``read_ahead``), do not go through the client's call machinery but through
:class:`_LeanRequests`: botocore's per-call work (its event system, parameter
validation, serialisation, response parsing) costs about 3.5 ms of CPU per request,
more than the request itself on a payload of a few KB, and at two requests a message it
was what kept the hub's throughput with this store under half the filesystem store's.
Those requests are signed by botocore's own SigV4 signer (``S3SigV4Auth``) with the
credentials, region and endpoint of the boto3 client (configuration stays in one place:
:func:`_make_client`), and sent over a urllib3 connection pool of this process (made
anew after a fork with the client). A PUT signs the payload's sha256, which its key
already is, as ``x-amz-content-sha256``: no second hash, and S3 refuses a body that does
not match it. They mean what the client's calls meant: the same retries as its standard
mode (connection errors, 500/502/503/504, throttling, with its backoff), the same
exceptions (a missing object is the client's ``NoSuchKey``, any other refusal a
``ClientError`` of the S3 error's code and message, a connection failure botocore's
``EndpointConnectionError`` and its kin), the body of a GET streamed and its length
checked by botocore's ``StreamingBody``. What S3 would redirect (a bucket in another
region than the client's) and a configured proxy go through the client as before.
Everything else (multipart uploads, copies, lists, deletes, heads, bucket creation) is
the client's.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote, urlsplit

from b2bhub.payloads.store import (
    DIGEST_RE,
    TEMP_GRACE,
    PayloadMissing,
    StoredPayload,
    VerifiedReader,
    _chunks,
    check_digest,
)

__all__ = ["S3PayloadBatch", "S3PayloadStore"]

#: the smallest part S3 accepts (every part but the last)
MIN_PART_SIZE = 5 * 1024 * 1024
TMP = "tmp"


@dataclass
class _Written:
    """A payload read and hashed: its bytes (``body``), or the temporary key it was
    uploaded to (``temp``)."""

    stored: StoredPayload
    body: bytes | None = None
    temp: str | None = None


class S3PayloadStore:
    """Stores payloads by sha256 as the objects ``<prefix>/<digest>`` of ``bucket``."""

    #: a GetObject per payload is a round trip: :meth:`read_ahead` spares the batch them
    reads_ahead = True

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 client_options: dict | None = None, part_size: int = 8 * 1024 * 1024,
                 batch_memory: int = 16 * 1024 * 1024, threads: int = 8,
                 read_ahead_size: int = 1024 * 1024,
                 clock: Callable[[], float] = time.time):
        if not bucket:
            raise ValueError("an S3 payload store needs a bucket name")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"S3 parts are at least {MIN_PART_SIZE} bytes")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or None
        self.part_size = part_size
        self.batch_memory = batch_memory
        self.threads = threads
        self.read_ahead_size = read_ahead_size
        self.clock = clock
        self._client_options = dict(client_options or {})
        self._client = None
        self._client_pid = 0
        self._lean: _LeanRequests | None = None
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, its threads)
        self._lock = threading.Lock()
        #: called with (operation name, key) before each PutObject and GetObject of a
        #: payload this store sends, in the thread sending it, whichever way it goes
        self.request_hooks: list[Callable[[str, str], None]] = []

    @classmethod
    def from_url(cls, url: str, **options) -> S3PayloadStore:
        """``s3://bucket/prefix`` (the prefix may be empty)."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3://bucket/prefix URL: {url!r}")
        return cls(parts.netloc, parts.path, **options)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def __repr__(self) -> str:
        return f"S3PayloadStore({self.url!r})"

    @property
    def client(self):
        """This process's boto3 client (a new one after a fork)."""
        if self._client is None or self._client_pid != os.getpid():
            with self._lock:
                if self._client is None or self._client_pid != os.getpid():
                    client = _make_client(self.endpoint_url, self.threads,
                                          self._client_options)
                    self._lean = _LeanRequests.for_client(
                        client, self.bucket, path_style=bool(self.endpoint_url),
                        verify=self._client_options.get("verify"))
                    self._client = client
                    self._client_pid = os.getpid()
        return self._client

    def _lean_requests(self) -> _LeanRequests | None:
        """This process's direct PUT and GET (None where they go through the client)."""
        self.client  # noqa: B018 (made with this process's client)
        lean = self._lean
        return lean if lean is not None and lean.usable else None

    def _put_object(self, key: str, body: bytes, digest: str) -> None:
        """PutObject of a payload in memory whose sha256 is ``digest``."""
        for hook in self.request_hooks:
            hook("PutObject", key)
        lean = self._lean_requests()
        if lean is not None:
            try:
                lean.put(key, body, digest)
                return
            except _UseClient:
                pass
        self.client.put_object(Bucket=self.bucket, Key=key, Body=body)

    def _get_object(self, key: str):
        """GetObject: (the body as botocore's StreamingBody, its length or None)."""
        for hook in self.request_hooks:
            hook("GetObject", key)
        lean = self._lean_requests()
        if lean is not None:
            try:
                return lean.get(key)
            except _UseClient:
                pass
        answer = self.client.get_object(Bucket=self.bucket, Key=key)
        return answer["Body"], answer.get("ContentLength")

    # keys --------------------------------------------------------------------
    def key(self, digest: str) -> str:
        """The object key a digest is stored under (whether or not it exists)."""
        return self._under(check_digest(digest))

    def _under(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _temp_key(self) -> str:
        return self._under(f"{TMP}/{int(self.clock() * 1000)}-{secrets.token_hex(8)}")

    # writing -----------------------------------------------------------------
    def put(self, data: bytes | BinaryIO, chunk_size: int = 1 << 20) -> StoredPayload:
        """Store ``data`` (bytes or a binary stream read in chunks, never whole) and
        return its digest and size; it is stored when this returns."""
        written = self._read(data, chunk_size)
        self._place(written)
        return written.stored

    def batch(self) -> S3PayloadBatch:
        return S3PayloadBatch(self)

    def _read(self, data: bytes | BinaryIO, chunk_size: int) -> _Written:
        """Hash ``data``; keep it if it fits in one part, else upload it to a temporary
        key part by part (an upload that fails is aborted)."""
        digest, size = hashlib.sha256(), 0
        buffer = bytearray()
        upload: _Multipart | None = None
        try:
            for chunk in _chunks(data, chunk_size):
                digest.update(chunk)
                size += len(chunk)
                buffer += chunk
                while len(buffer) >= self.part_size:
                    if upload is None:
                        upload = _Multipart(self, self._temp_key())
                    upload.send(bytes(buffer[:self.part_size]))
                    del buffer[:self.part_size]
            stored = StoredPayload(digest.hexdigest(), size)
            if upload is None:
                return _Written(stored, body=bytes(buffer))
            if buffer:
                upload.send(bytes(buffer))
            upload.complete()
            return _Written(stored, temp=upload.key)
        except BaseException:
            if upload is not None:
                upload.abort()
            raise

    def _to_temp(self, written: _Written) -> None:
        """Move a payload held in memory to a temporary key (a batch past its memory)."""
        key = self._temp_key()
        self._put_object(key, written.body, written.stored.digest)
        written.body, written.temp = None, key

    def _place(self, written: _Written) -> None:
        """Put a payload under its digest; a temporary object is copied and deleted."""
        final = self.key(written.stored.digest)
        if written.temp is None:
            self._put_object(final, written.body or b"", written.stored.digest)
            return
        try:
            # boto3's managed copy: one CopyObject, or UploadPartCopy beyond its threshold
            # (CopyObject stops at 5 GB); no byte comes through this process.
            self.client.copy({"Bucket": self.bucket, "Key": written.temp}, self.bucket,
                             final, Config=_copy_config(self.part_size))
        finally:
            self._delete_temp(written)

    def _delete_temp(self, written: _Written) -> None:
        if written.temp is not None:
            self.client.delete_object(Bucket=self.bucket, Key=written.temp)
            written.temp = None

    # reading -----------------------------------------------------------------
    def open(self, digest: str) -> VerifiedReader:
        """Open a stored payload for reading (streamed); the sha256 is checked at the end."""
        key = self.key(digest)
        try:
            body, _length = self._get_object(key)
        except self.client.exceptions.NoSuchKey:
            raise PayloadMissing(digest) from None
        return VerifiedReader(digest, _Body(body))

    def read_ahead(self, wanted: dict[str, int]) -> dict[str, bytes]:
        """The bytes of the ``wanted`` payloads ({digest: size as recorded}) of at most
        ``read_ahead_size`` each and ``batch_memory`` in all, in the order given, got
        in parallel: {digest: bytes}, not yet checked against the digest. One whose
        GetObject fails or whose length is not its recorded size is left out (its
        :meth:`open` reports what is wrong)."""
        chosen, total = {}, 0
        for digest, size in wanted.items():
            if size <= self.read_ahead_size and total + size <= self.batch_memory:
                chosen[digest] = size
                total += size
        if not chosen:
            return {}
        futures = self._each(lambda digest: self._get_whole(digest, chosen[digest]), chosen)
        got = {}
        for digest, future in zip(chosen, futures, strict=True):
            if future.exception() is None and future.result() is not None:
                got[digest] = future.result()
        return got

    def _get_whole(self, digest: str, size: int) -> bytes | None:
        """The object's bytes, or None (nothing read) when it is not ``size`` bytes long."""
        body, length = self._get_object(self.key(digest))
        try:
            if length is None or int(length) != size:
                return None
            return body.read()
        finally:
            body.close()

    def _each(self, call: Callable, items) -> list[Future]:
        """``call(item)`` for every item, on up to ``threads`` threads at once; returns
        once every call has ended, their futures in the items' order."""
        pool = self._threads()
        futures = [pool.submit(call, item) for item in items]
        wait(futures)
        return futures

    def _threads(self) -> ThreadPoolExecutor:
        """This process's ``threads`` threads for a batch's requests, made at first use
        (anew after a fork) and kept: a pool made for each batch started up to
        ``threads`` threads per batch of deliveries and per batch of intake, about a
        thread per message. The callers wait for their own futures only; none of the
        calls submits to the pool, so no call waits for a thread its caller holds."""
        made = self._pool
        if made is None or made[0] != os.getpid():
            with self._lock:
                if self._pool is None or self._pool[0] != os.getpid():
                    self._pool = (os.getpid(), ThreadPoolExecutor(
                        max(1, self.threads), thread_name_prefix="s3-payloads"))
                made = self._pool
        return made[1]

    def _head(self, digest: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key(digest))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def exists(self, digest: str) -> bool:
        return self._head(digest) is not None

    def size(self, digest: str) -> int:
        head = self._head(digest)
        if head is None:
            raise PayloadMissing(digest)
        return int(head["ContentLength"])

    # cleanup -----------------------------------------------------------------
    def iter_digests(self) -> Iterator[str]:
        """Every digest stored, in no particular order (for the orphan cleanup)."""
        for digest, _modified, _size in self._iter_objects():
            yield digest

    def _iter_objects(self) -> Iterator[tuple[str, float, int]]:
        """(digest, LastModified as a timestamp, size) of every stored payload."""
        start = self._under("")
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=start, Delimiter="/")
        for page in pages:
            for item in page.get("Contents", []):
                name = item["Key"][len(start):]
                if DIGEST_RE.fullmatch(name):
                    yield name, item["LastModified"].timestamp(), int(item["Size"])

    def walk(self) -> Iterator[tuple[str, int, float]]:
        """(digest, size, age in seconds) of every stored payload, in no particular order
        (the nightly cleanup's walk; the age counts from the object's last write, which
        a put of the same content renews)."""
        now = self.clock()
        for digest, modified, size in self._iter_objects():
            yield digest, size, now - modified

    def older_than(self, digest: str, seconds: float) -> bool:
        """Whether the payload of ``digest`` was last written longer ago than ``seconds``
        (False when there is none)."""
        head = self._head(digest)
        return head is not None and head["LastModified"].timestamp() < self.clock() - seconds

    def remove_unreferenced(self, digest: str, is_referenced: Callable[[str], bool],
                            cutoff: float) -> int | None:
        """Delete the payload of ``digest`` if it was last written before ``cutoff`` (a
        time.time()) and is not referenced; its size, or None when it stays. The age is
        read again after the reference check: a put of the same content in between
        renews it, and the new reference survives (see :meth:`remove_orphans`)."""
        head = self._head(digest)
        if head is None or head["LastModified"].timestamp() >= cutoff \
                or is_referenced(digest):
            return None
        head = self._head(digest)
        if head is None or head["LastModified"].timestamp() >= cutoff:
            return None
        self.client.delete_object(Bucket=self.bucket, Key=self.key(digest))
        return int(head["ContentLength"])

    def remove_stale_temp(self, older_than_seconds: float = TEMP_GRACE) -> int:
        """Delete temporary objects and abort multipart uploads older than
        ``older_than_seconds``: what writes of processes that died left. A write still
        under way whose upload is aborted this way fails, stores nothing, and its
        payload is taken again; nothing is lost. Returns how many went."""
        return self._remove_old_temp(self.clock() - older_than_seconds)

    def _remove_old_temp(self, cutoff: float) -> int:
        start = self._under(f"{TMP}/")
        removed = 0
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=start)
        for page in pages:
            for item in page.get("Contents", []):
                if _temp_age(item["Key"], item["LastModified"].timestamp()) < cutoff:
                    self.client.delete_object(Bucket=self.bucket, Key=item["Key"])
                    removed += 1
        for upload in self.temp_uploads():
            if _temp_age(upload["Key"], upload["Initiated"].timestamp()) < cutoff:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                   UploadId=upload["UploadId"])
                removed += 1
        return removed

    def temp_objects(self) -> list[str]:
        """The keys of the temporary objects there are now."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._under(f"{TMP}/"))
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def temp_uploads(self) -> list[dict]:
        """The multipart uploads under way (or abandoned) to temporary keys."""
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=self._under(f"{TMP}/"))
        return [upload for page in pages for upload in page.get("Uploads", [])]


class S3PayloadBatch:
    """Payloads stored together (see :class:`b2bhub.payloads.store.PayloadBatch`): nothing is
    under its digest before :meth:`commit`, which stores them all in parallel and
    returns once every one is stored; use the digests in a transaction only after it."""

    def __init__(self, store: S3PayloadStore):
        self.store = store
        self._written: list[_Written] = []
        self._held = 0

    def __len__(self) -> int:
        return len(self._written)

    def put(self, data: bytes | BinaryIO, chunk_size: int = 1 << 20,
            link: object = None) -> StoredPayload:
        """Read and hash ``data``; ``link`` (a hard link on the filesystem) is ignored:
        an object store takes a copy."""
        written = self.store._read(data, chunk_size)
        if written.body is not None:
            if self._held + len(written.body) > self.store.batch_memory:
                self.store._to_temp(written)
            else:
                self._held += len(written.body)
        self._written.append(written)
        return written.stored

    def drop(self, stored: StoredPayload) -> None:
        """Forget a payload :meth:`put` returned (it is not wanted after all)."""
        keep = []
        for written in self._written:
            if written.stored is stored:
                self._forget(written)
            else:
                keep.append(written)
        self._written = keep

    def _forget(self, written: _Written) -> None:
        if written.body is not None:
            self._held -= len(written.body)
            written.body = None
        self.store._delete_temp(written)

    def commit(self) -> None:
        """Every payload stored under its digest (one copy of content put twice)."""
        written, self._written, self._held = self._written, [], 0
        unique: dict[str, _Written] = {}
        for item in written:
            if item.stored.digest in unique:
                self.store._delete_temp(item)
            else:
                unique[item.stored.digest] = item
        if not unique:
            return
        items = list(unique.values())
        try:
            if len(items) == 1:
                self.store._place(items[0])
                return
            for future in self.store._each(self.store._place, items):
                future.result()
        finally:
            for item in items:
                if item.temp is not None:
                    try:
                        self.store._delete_temp(item)
                    except Exception:  # the orphan cleanup takes it later
                        pass

    def discard(self) -> None:
        """Forget the payloads not committed (their temporary objects deleted)."""
        written, self._written = self._written, []
        for item in written:
            self._forget(item)
        self._held = 0


class _Multipart:
    """A multipart upload to a temporary key, one part at a time."""

    def __init__(self, store: S3PayloadStore, key: str):
        self.store, self.key = store, key
        self.client = store.client
        self.id = self.client.create_multipart_upload(Bucket=store.bucket, Key=key)["UploadId"]
        self.parts: list[dict] = []

    def send(self, body: bytes) -> None:
        number = len(self.parts) + 1
        answer = self.client.upload_part(Bucket=self.store.bucket, Key=self.key,
                                         UploadId=self.id, PartNumber=number, Body=body)
        self.parts.append({"PartNumber": number, "ETag": answer["ETag"]})

    def complete(self) -> None:
        self.client.complete_multipart_upload(Bucket=self.store.bucket, Key=self.key,
                                              UploadId=self.id,
                                              MultipartUpload={"Parts": self.parts})

    def abort(self) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.key,
                                               UploadId=self.id)
        except Exception:  # the stale-temp cleanup aborts it later
            pass


class _Body:
    """A GetObject body as the raw file :class:`VerifiedReader` reads with ``readinto``
    (botocore checks the length it was promised at the end)."""

    def __init__(self, body):
        self._body = body

    def readinto(self, buffer) -> int:
        data = self._body.read(len(buffer))
        count = len(data)
        memoryview(buffer)[:count] = data
        return count

    def close(self) -> None:
        self._body.close()


def _temp_age(key: str, fallback: float) -> float:
    """When a temporary key was made: the milliseconds in its name, else ``fallback``."""
    stamp = key.rsplit("/", 1)[-1].split("-", 1)[0]
    return int(stamp) / 1000 if stamp.isdigit() else fallback


def _copy_config(part_size: int):
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=4 * 1024 ** 3, multipart_chunksize=
                          max(part_size, 64 * 1024 * 1024), use_threads=False)


def _make_client(endpoint_url: str | None, threads: int, options: dict):
    """An S3 client from the standard AWS variables (credentials, ``AWS_REGION`` or
    ``AWS_DEFAULT_REGION``, us-east-1 when neither is set) and the endpoint URL of an
    S3-compatible server, path-style addressing there."""
    import boto3
    from botocore.config import Config

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    # Checksums only where S3 requires them (botocore's default since 1.36 adds a CRC32
    # to every upload and checks one on every download): every read is checked against
    # the payload's sha256 already, and some S3-compatible servers refuse the new
    # checksum headers.
    config = Config(max_pool_connections=max(10, threads * 2),
                    retries={"mode": "standard", "max_attempts": 5},
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    s3={"addressing_style": "path"} if endpoint_url else {})
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url,
                                          region_name=region, config=config, **options)


class _UseClient(Exception):
    """The answer says this request is the client's to make (S3 redirects it: a bucket in
    another region than the client's, which the client finds and remembers)."""


#: what the client's standard retry mode retries besides 500, 502, 503, 504 and 429:
#: transient errors, and throttling (the longer backoff)
_TRANSIENT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException",
                              "PriorRequestNotComplete"})
_THROTTLING_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException",
    "TransactionInProgressException", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "LimitExceededException", "RequestThrottled", "SlowDown", "PriorRequestNotComplete",
    "EC2ThrottledException"})
_RETRIED_STATUS = frozenset({500, 502, 503, 504, 429})
#: S3's answers that the request went to the wrong region's endpoint
_REDIRECTS = frozenset({"PermanentRedirect", "TemporaryRedirect",
                        "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"})
_VIRTUAL_HOST_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


def object_url(endpoint_url: str, bucket: str, key: str, *, path_style: bool) -> str:
    """The URL of ``key`` in ``bucket`` as the client addresses it: under the endpoint's
    path with the bucket first (path style: an S3-compatible server's endpoint URL, or a
    bucket name that cannot be a TLS host name, such as one with dots), else on the
    bucket's own host name (virtual-hosted, as AWS wants). The key is percent-encoded
    as botocore encodes it."""
    parts = urlsplit(endpoint_url)
    path = quote(key, safe="/~")
    base = parts.path.rstrip("/")
    if path_style or not _VIRTUAL_HOST_BUCKET.fullmatch(bucket):
        return f"{parts.scheme}://{parts.netloc}{base}/{quote(bucket, safe='~')}/{path}"
    return f"{parts.scheme}://{bucket}.{parts.netloc}{base}/{path}"


class _LeanRequests:
    """PutObject and GetObject of one bucket, signed with botocore's SigV4 signer and sent
    over a urllib3 pool of their own, everything taken from one boto3 client (see the
    module docstring); made per process, with the client."""

    def __init__(self, client, bucket: str, *, path_style: bool, verify=None):
        import urllib3
        from botocore.httpsession import get_cert_path

        config = client.meta.config
        self.client = client
        self.bucket = bucket
        self.region = client.meta.region_name
        self.endpoint_url = client.meta.endpoint_url
        self.path_style = path_style
        # Asked per request, as the client's signer asks: refreshable credentials (an
        # assumed role, an instance profile) renew themselves. The client's method,
        # private by its name, is the one boto3's own CRT transfers read it with; the
        # alternative (client._request_signer._credentials) reaches two levels further in.
        self._credentials = client._get_credentials
        self.max_attempts = max(1, int((config.retries or {}).get("total_max_attempts", 3)))
        self.user_agent = config.user_agent
        self.usable = True
        origin = urlsplit(object_url(self.endpoint_url, bucket, "k", path_style=path_style))
        tls = {}
        if origin.scheme == "https":
            verify = _default_verify() if verify is None else verify
            tls = ({"cert_reqs": "CERT_REQUIRED", "ca_certs": get_cert_path(verify)}
                   if verify else {"cert_reqs": "CERT_NONE"})
        self.pool = urllib3.connectionpool.connection_from_url(
            f"{origin.scheme}://{origin.netloc}", maxsize=config.max_pool_connections,
            timeout=urllib3.Timeout(connect=config.connect_timeout, read=config.read_timeout),
            retries=False, **tls)
        self.pid = os.getpid()

    @classmethod
    def for_client(cls, client, bucket: str, *, path_style: bool,
                   verify=None) -> _LeanRequests | None:
        """The direct requests for ``client``, or None where they must stay the client's:
        a proxy is configured (the client's business), or the bucket is an access point's
        ARN or a directory bucket (other signing)."""
        from botocore.utils import get_environ_proxies

        if ":" in bucket or bucket.endswith("--x-s3") or client.meta.config.proxies:
            return None
        url = object_url(client.meta.endpoint_url, bucket, "k", path_style=path_style)
        if get_environ_proxies(url).get(urlsplit(url).scheme):
            return None
        return cls(client, bucket, path_style=path_style, verify=verify)

    def url(self, key: str) -> str:
        return object_url(self.endpoint_url, self.bucket, key, path_style=self.path_style)

    def put(self, key: str, body: bytes, sha256: str) -> None:
        """PutObject of ``body`` whose sha256 is ``sha256``."""
        self._send("PutObject", "PUT", key, body, sha256).release_conn()

    def get(self, key: str):
        """GetObject: (botocore's StreamingBody over the response, its Content-Length)."""
        from botocore.auth import EMPTY_SHA256_HASH
        from botocore.response import StreamingBody

        response = self._send("GetObject", "GET", key, None, EMPTY_SHA256_HASH)
        length = response.headers.get("Content-Length")
        length = int(length) if length is not None else None
        return StreamingBody(response, length), length

    def _send(self, operation: str, method: str, key: str, body: bytes | None,
              sha256: str):
        """The response (2xx) to the request, sent again as the client's standard retry
        mode would; its body not read yet."""
        import random

        import urllib3

        url = self.url(key)
        target = url[url.index("/", len(urlsplit(url).scheme) + 3):]
        for attempt in range(1, self.max_attempts + 1):
            headers = self._signed(method, url, body, sha256)
            try:
                response = self.pool.urlopen(
                    method, target, body=body, headers=headers, retries=False,
                    redirect=False, assert_same_host=False, preload_content=False,
                    decode_content=False, enforce_content_length=False)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                error = _connection_error(exc, url)
                if attempt == self.max_attempts:
                    raise error from exc
                time.sleep(random.random() * min(0.05 * 2 ** (attempt - 1), 20))
                continue
            if 200 <= response.status < 300:
                return response
            try:
                answer = _error_response(response.status, response.headers, response.data,
                                         attempt - 1)
            finally:
                response.release_conn()
            code = answer["Error"]["Code"]
            if response.status in (301, 307) or code in _REDIRECTS:
                self.usable = False  # the client finds the bucket's region from now on
                raise _UseClient(code)
            throttled = code in _THROTTLING_CODES or response.status == 429
            if throttled or code in _TRANSIENT_CODES or response.status in _RETRIED_STATUS:
                if attempt < self.max_attempts:
                    scale = 1 if throttled else 0.05
                    time.sleep(random.random() * min(scale * 2 ** (attempt - 1), 20))
                    continue
                answer["ResponseMetadata"]["MaxAttemptsReached"] = True
            raise self.client.exceptions.from_code(code)(answer, operation)
        raise AssertionError("unreachable")

    def _signed(self, method: str, url: str, body: bytes | None, sha256: str) -> dict:
        """The headers of the request, signed now (a retry is signed again)."""
        from botocore.awsrequest import AWSRequest
        from botocore.exceptions import NoCredentialsError

        credentials = self._credentials()
        if credentials is None:
            raise NoCredentialsError()
        request = AWSRequest(method=method, url=url, data=body,
                             headers={"User-Agent": self.user_agent})
        _signer(credentials.get_frozen_credentials(), self.region, sha256).add_auth(request)
        return dict(request.headers.items())


def _signer(credentials, region: str, sha256: str):
    """botocore's S3 SigV4 signer, told the payload's sha256 instead of hashing it."""
    return _signer_class()(credentials, region, sha256)


@functools.cache
def _signer_class():
    from botocore.auth import S3SigV4Auth

    class KnownPayload(S3SigV4Auth):
        def __init__(self, credentials, region: str, sha256: str):
            super().__init__(credentials, "s3", region)
            self._sha256 = sha256

        def payload(self, request) -> str:
            return self._sha256

    return KnownPayload


def _default_verify():
    """The CA bundle the client verifies with when its options name none: the
    ``ca_bundle`` of the AWS configuration (``AWS_CA_BUNDLE``), ``REQUESTS_CA_BUNDLE``,
    else botocore's default (True)."""
    import botocore.session

    return (botocore.session.get_session().get_config_variable("ca_bundle")
            or os.environ.get("REQUESTS_CA_BUNDLE") or True)


def _connection_error(exc: Exception, url: str) -> Exception:
    """The botocore exception the client raises for what urllib3 raised."""
    import socket

    from botocore import exceptions as be
    from urllib3 import exceptions as ue

    if isinstance(exc, ue.SSLError):
        return be.SSLError(endpoint_url=url, error=exc)
    if isinstance(exc, (ue.NewConnectionError, socket.gaierror)):
        return be.EndpointConnectionError(endpoint_url=url, error=exc)
    if isinstance(exc, ue.ConnectTimeoutError):
        return be.ConnectTimeoutError(endpoint_url=url, error=exc)
    if isinstance(exc, ue.ReadTimeoutError):
        return be.ReadTimeoutError(endpoint_url=url, error=exc)
    if isinstance(exc, ue.ProtocolError):
        return be.ConnectionClosedError(error=exc, request=None, endpoint_url=url)
    return be.HTTPClientError(error=exc)


def _error_response(status: int, headers, data: bytes, retries: int) -> dict:
    """A refusal as botocore parses it for a ClientError: the S3 XML error's Code and
    Message (the status as the code when the body has none, as on a HEAD), and the
    response's metadata."""
    from xml.etree import ElementTree

    error = {"Code": str(status), "Message": ""}
    metadata = {"HTTPStatusCode": status, "HTTPHeaders": {k.lower(): v for k, v in
                                                          headers.items()},
                "RetryAttempts": retries}
    try:
        root = ElementTree.fromstring(data) if data else None
    except ElementTree.ParseError:
        root = None
    if root is not None:
        for child in root:
            if child.tag in ("RequestId", "HostId"):
                metadata[child.tag] = child.text or ""
            elif not len(child):
                error[child.tag] = child.text or ""
    if "x-amz-request-id" in metadata["HTTPHeaders"]:
        metadata.setdefault("RequestId", metadata["HTTPHeaders"]["x-amz-request-id"])
    return {"Error": error, "ResponseMetadata": metadata}
