"""The payload store keeps bytes by sha256, streams them both ways and never hands out
corrupt or half-written content.

Every test taking ``store`` runs against each backend: the filesystem store and the
S3 store on a real S3-compatible server on loopback (``tests/s3kit.py``). What only
one backend has (paths, hard links, syncfs; multipart uploads) is tested on
``fs_store`` or ``s3_store`` alone.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from b2bhub.payloads import store as payloads
from b2bhub.payloads.store import (
    LOCK_FILE,
    PayloadCorrupt,
    PayloadMissing,
    PayloadStore,
    StoredPayload,
)
from tests.factories import digests_in, sweep
from tests.payload_child import PatternStream
from tests.s3kit import age_object

ROOT = Path(__file__).resolve().parent.parent

DOC = b"UNB+UNOC:3+SENDER+RECEIVER+240101:1200+1'\n" * 1000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def age(path, seconds: float) -> None:
    """Make a file look ``seconds`` old."""
    then = time.time() - seconds
    os.utime(path, (then, then))


class FileBackend:
    """The filesystem store, and what a test does to it behind its back."""

    #: the most memory a 50 MB put may take (one read chunk and bookkeeping)
    memory_bound = 5 * 1024 * 1024

    def __init__(self, tmp_path: Path):
        self.store = PayloadStore(tmp_path / "payloads")

    def locate(self, digest: str):
        return self.store.path(digest)

    def env(self) -> dict[str, str]:
        """How a process of its own names this store."""
        return {"B2BHUB_PAYLOAD_URL": str(self.store.root)}

    def layout(self, digest: str) -> str:
        return f"{digest[:2]}/{digest[2:4]}/{digest}"

    def stored_names(self) -> list[str]:
        """Every file stored outside ``tmp``, relative to the root."""
        root = self.store.root
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and p.relative_to(root).parts[0] != "tmp"
                      and p.name != LOCK_FILE)  # the store's lock, no payload

    def age(self, digest: str, seconds: float) -> None:
        age(self.store.path(digest), seconds)

    def overwrite(self, digest: str, data: bytes) -> None:
        self.store.path(digest).write_bytes(data)

    def temp_files(self) -> list:
        tmp = self.store.root / "tmp"
        return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []

    def add_temp(self, name: str, seconds_old: float) -> None:
        tmp = self.store.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(b"interrupted")
        age(tmp / name, seconds_old)

    def add_stray(self, seconds_old: float) -> Path:
        stray = self.store.root / "ab" / "README"
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_text("not a payload")
        age(stray, seconds_old)
        return stray

    def stray_exists(self, stray: Path) -> bool:
        return stray.exists()


class S3Backend:
    """The S3 store on a bucket of its own."""

    #: one part (8 MiB by default) being read, the part being sent, and the client's
    #: bookkeeping
    memory_bound = 32 * 1024 * 1024

    def __init__(self, server):
        self.server = server
        self.store = server.store()
        self.client = self.store.client

    def env(self) -> dict[str, str]:
        return self.server.env(self.store.bucket)

    def locate(self, digest: str):
        return self.store.key(digest)

    def layout(self, digest: str) -> str:
        return f"payloads/{digest}"

    def stored_names(self) -> list[str]:
        listed = self.client.list_objects_v2(Bucket=self.store.bucket)
        return sorted(item["Key"] for item in listed.get("Contents", [])
                      if not item["Key"].startswith("payloads/tmp/"))

    def age(self, digest: str, seconds: float) -> None:
        age_object(self.store.bucket, self.store.key(digest), seconds)

    def overwrite(self, digest: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.store.bucket, Key=self.store.key(digest), Body=data)

    def temp_files(self) -> list:
        return sorted([key.rsplit("/", 1)[-1] for key in self.store.temp_objects()]
                      + [u["Key"].rsplit("/", 1)[-1] for u in self.store.temp_uploads()])

    def add_temp(self, name: str, seconds_old: float) -> None:
        """A temporary object as a write makes it, its time in the name."""
        stamp = int((time.time() - seconds_old) * 1000)
        self.client.put_object(Bucket=self.store.bucket, Key=f"payloads/tmp/{stamp}-{name}",
                               Body=b"interrupted")

    def add_stray(self, seconds_old: float) -> str:
        key = "payloads/README"
        self.client.put_object(Bucket=self.store.bucket, Key=key, Body=b"not a payload")
        age_object(self.store.bucket, key, seconds_old)
        return key

    def stray_exists(self, key: str) -> bool:
        listed = self.client.list_objects_v2(Bucket=self.store.bucket, Prefix=key)
        return any(item["Key"] == key for item in listed.get("Contents", []))


@pytest.fixture(params=["file", "s3"])
def backend_of_store(request, tmp_path):
    if request.param == "file":
        return FileBackend(tmp_path)
    return S3Backend(request.getfixturevalue("s3_server"))


@pytest.fixture
def store(backend_of_store):
    return backend_of_store.store


#: a test of what only the filesystem store has (paths, hard links, syncfs)
fs_only = pytest.mark.parametrize("backend_of_store", ["file"], indirect=True)
#: a test of what only the S3 store has (multipart uploads, temporary keys)
s3_only = pytest.mark.parametrize("backend_of_store", ["s3"], indirect=True)


def test_bytes_round_trip(store, backend_of_store):
    stored = store.put(DOC)
    assert stored == StoredPayload(sha(DOC), len(DOC))
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC
    assert backend_of_store.stored_names() == [backend_of_store.layout(stored.digest)]
    assert store.size(stored.digest) == len(DOC)


@fs_only
def test_a_payload_is_a_file_under_two_levels_of_shards(store):
    stored = store.put(DOC)
    assert store.path(stored.digest).relative_to(store.root).parts == (
        stored.digest[:2],
        stored.digest[2:4],
        stored.digest,
    )


def test_stream_round_trip_in_chunks(store):
    stored = store.put(io.BytesIO(DOC), chunk_size=1000)
    assert stored.digest == sha(DOC)
    with store.open(stored.digest) as stream:
        first = stream.read(10)
        rest = b"".join(stream)
        assert stream.verified
    assert first + rest == DOC


def test_empty_payload(store):
    stored = store.put(b"")
    assert stored == StoredPayload(sha(b""), 0)
    with store.open(stored.digest) as stream:
        assert stream.read() == b""


def test_identical_content_is_stored_once(store, backend_of_store):
    first = store.put(DOC)
    second = store.put(io.BytesIO(DOC))
    assert first == second
    assert list(digests_in(store)) == [first.digest]
    assert backend_of_store.stored_names() == [backend_of_store.layout(first.digest)]
    assert backend_of_store.temp_files() == []


def test_text_stream_is_refused_and_leaves_no_temp_file(store, backend_of_store):
    with pytest.raises(TypeError):
        store.put(io.StringIO("text"))
    assert backend_of_store.temp_files() == []
    assert backend_of_store.stored_names() == []


def test_flipped_byte_on_disk_is_detected_at_end_of_read(store, backend_of_store):
    stored = store.put(DOC)
    data = bytearray(DOC)
    data[100] ^= 0x01
    backend_of_store.overwrite(stored.digest, bytes(data))

    with store.open(stored.digest) as stream, pytest.raises(PayloadCorrupt) as info:
        stream.read()
    assert info.value.digest == stored.digest
    with store.open(stored.digest) as stream, pytest.raises(PayloadCorrupt):
        b"".join(stream)


def test_truncated_file_is_detected_and_repaired_by_a_new_put(store, backend_of_store):
    stored = store.put(DOC)
    backend_of_store.overwrite(stored.digest, DOC[:-1])
    with store.open(stored.digest) as stream, pytest.raises(PayloadCorrupt):
        stream.read()
    store.put(DOC)
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC


def test_missing_payload_raises(store):
    digest = sha(b"never stored")
    assert not store.exists(digest)
    with pytest.raises(PayloadMissing) as info:
        store.open(digest)
    assert info.value.digest == digest
    with pytest.raises(PayloadMissing):
        store.size(digest)


@pytest.mark.parametrize(
    "digest",
    [
        "../" * 20 + "etc/passwd",
        "a" * 63,
        "a" * 65,
        "A" * 64,
        "g" * 64,
        "aa/bb/" + "a" * 58,
        "",
    ],
)
def test_bad_digest_is_refused(store, backend_of_store, digest):
    for call in (backend_of_store.locate, store.open, store.exists, store.size):
        with pytest.raises(ValueError):
            call(digest)


def test_large_stream_is_stored_with_little_memory(store, backend_of_store):
    """50 MB streamed into the store by a process of its own (its memory measured
    apart from the S3 server of the tests) takes a bounded amount of memory."""
    size = 50 * 1024 * 1024
    expected = hashlib.sha256()
    source = PatternStream(size)
    while chunk := source.read(1 << 16):
        expected.update(chunk)

    done = subprocess.run([sys.executable, "-m", "tests.payload_child", str(size)],
                          env={**os.environ, **backend_of_store.env()}, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    digest, stored_size, peak = done.stdout.split()

    assert (digest, int(stored_size)) == (expected.hexdigest(), size)
    assert int(peak) < backend_of_store.memory_bound
    assert store.size(digest) == size
    with store.open(digest) as stream:
        assert hashlib.sha256(b"".join(stream)).hexdigest() == digest


def test_orphan_removal_respects_grace_period(store, backend_of_store):
    kept = store.put(b"referenced")
    young = store.put(b"written just before its transaction commits")
    old = store.put(b"orphan from a rolled back transaction")
    for stored in (kept, old):
        backend_of_store.age(stored.digest, 7200)

    removed = sweep(store, {kept.digest}, older_than_seconds=3600)

    assert removed == 1
    assert sorted(digests_in(store)) == sorted([kept.digest, young.digest])


def test_orphan_removal_takes_a_predicate(store, backend_of_store):
    stored = store.put(b"orphan")
    backend_of_store.age(stored.digest, 10)
    assert sweep(store, lambda digest: False, older_than_seconds=5) == 1
    assert not store.exists(stored.digest)


def test_putting_an_old_orphan_again_renews_its_grace_period(store, backend_of_store):
    stored = store.put(DOC)
    backend_of_store.age(stored.digest, 7200)
    store.put(DOC)
    assert sweep(store, set(), older_than_seconds=3600) == 0
    assert store.exists(stored.digest)


def test_the_cleanup_walks_the_store_and_removes_one_unreferenced_old_file(
        store, backend_of_store):
    """What the nightly cleanup asks of any store (b2bhub.engine.cleanup): every payload
    with its size and age, whether one is old, and removing one that is old and
    unreferenced, never one that is young or referenced."""
    old, young, kept = (store.put(b"old orphan"), store.put(b"young"),
                        store.put(b"old, referenced"))
    for stored in (old, kept):
        backend_of_store.age(stored.digest, 7200)
    walked = {digest: (size, age) for digest, size, age in store.walk()}
    assert {d: size for d, (size, _age) in walked.items()} == {
        old.digest: old.size, young.digest: young.size, kept.digest: kept.size}
    assert walked[old.digest][1] > 3600 > walked[young.digest][1]
    assert store.older_than(old.digest, 3600) and not store.older_than(young.digest, 3600)
    assert not store.older_than(sha(b"never stored"), 0)
    cutoff = time.time() - 3600
    referenced = {kept.digest}.__contains__
    assert store.remove_unreferenced(young.digest, referenced, cutoff) is None
    assert store.remove_unreferenced(kept.digest, referenced, cutoff) is None
    assert store.remove_unreferenced(old.digest, referenced, cutoff) == old.size
    assert store.remove_unreferenced(old.digest, referenced, cutoff) is None  # gone
    assert sorted(digests_in(store)) == sorted([young.digest, kept.digest])


def test_old_temp_files_are_removed_and_fresh_ones_kept(store, backend_of_store):
    store.put(b"creates the tmp folder")
    backend_of_store.add_temp("put-old", 7200)
    backend_of_store.add_temp("put-new", 0)
    stray = backend_of_store.add_stray(7200)

    removed = sweep(store, lambda digest: True, older_than_seconds=3600)

    assert removed == 1
    assert [name[-7:] for name in backend_of_store.temp_files()] == ["put-new"]
    assert backend_of_store.stray_exists(stray)


def test_an_empty_store_walks_nothing(store):
    assert list(digests_in(store)) == []
    assert sweep(store, set()) == 0


# --- a batch: durability paid once, nothing in place before the commit ---------------

def temp_files(store) -> list:
    tmp = store.root / "tmp"
    return sorted(tmp.iterdir()) if tmp.is_dir() else []


def test_a_batch_puts_nothing_in_place_before_its_commit(store, backend_of_store):
    batch = store.batch()
    first = batch.put(DOC)
    second = batch.put(io.BytesIO(DOC[::-1]), chunk_size=1000)
    assert (first, second) == (StoredPayload(sha(DOC), len(DOC)),
                               StoredPayload(sha(DOC[::-1]), len(DOC)))
    assert not store.exists(first.digest) and not store.exists(second.digest)

    batch.commit()
    with store.open(first.digest) as a, store.open(second.digest) as b:
        assert (a.read(), b.read()) == (DOC, DOC[::-1])
    assert backend_of_store.temp_files() == []
    assert len(batch) == 0


@fs_only
def test_directories_removed_under_the_store_are_made_again(store):
    """Directories are made when a write first needs them, not checked every time: the
    temp directory and the fan-out directories come back when something removed them."""
    import shutil

    first = store.put(DOC)
    shutil.rmtree(store.root)
    second = store.put(DOC)
    assert second == first
    with store.open(first.digest) as stream:
        assert stream.read() == DOC
    shutil.rmtree(store.root)
    batch = store.batch()
    other = batch.put(DOC[::-1])
    assert not store.path(other.digest).parent.parent.exists()
    batch.commit()
    with store.open(other.digest) as stream:
        assert stream.read() == DOC[::-1]
    assert temp_files(store) == []


def test_a_batch_keeps_one_copy_of_content_already_stored_or_put_twice(store, backend_of_store):
    store.put(DOC)
    batch = store.batch()
    batch.put(DOC)
    batch.put(b"twice")
    batch.put(b"twice")
    batch.commit()
    assert sorted(digests_in(store)) == sorted([sha(DOC), sha(b"twice")])
    assert backend_of_store.temp_files() == []


def test_a_dropped_or_discarded_payload_leaves_nothing(store, backend_of_store):
    batch = store.batch()
    kept = batch.put(b"kept")
    batch.drop(batch.put(b"changed while read"))
    batch.commit()
    assert list(digests_in(store)) == [kept.digest]

    batch.put(b"never committed")
    batch.discard()
    batch.commit()
    assert list(digests_in(store)) == [kept.digest]
    assert backend_of_store.temp_files() == []


def test_a_batch_whose_put_fails_keeps_the_others(store, backend_of_store):
    batch = store.batch()
    batch.put(b"one")
    with pytest.raises(TypeError):
        batch.put(io.StringIO("text"))
    batch.commit()
    assert list(digests_in(store)) == [sha(b"one")]
    assert backend_of_store.temp_files() == []


@fs_only
def test_a_batch_renames_into_place_then_syncs_once(store, monkeypatch):
    """Where syncfs exists, one call makes the data and the new names durable: it comes
    after every payload is in place, and no file is fsynced on its own."""
    from b2bhub.payloads import store as payloads

    calls = []

    def fake_syncfs(fd):
        calls.append(sorted(digests_in(store)))
        return 0

    fsyncs = []
    monkeypatch.setattr(payloads, "_SYNCFS", fake_syncfs)
    monkeypatch.setattr(payloads.os, "fsync", lambda fd: fsyncs.append(fd))
    batch = store.batch()
    batch.put(DOC)
    batch.put(b"second")
    batch.commit()
    assert calls == [sorted([sha(DOC), sha(b"second")])]
    assert fsyncs == []
    assert temp_files(store) == []


@fs_only
def test_a_failed_sync_raises_and_leaves_no_temp_file(store, monkeypatch):
    from b2bhub.payloads import store as payloads

    monkeypatch.setattr(payloads, "_SYNCFS", lambda fd: -1)
    batch = store.batch()
    batch.put(DOC)
    with pytest.raises(OSError):
        batch.commit()
    assert temp_files(store) == []


@fs_only
def test_without_syncfs_a_batch_fsyncs_each_file_before_its_rename(store, monkeypatch):
    from b2bhub.payloads import store as payloads

    real_fsync, synced_before_place = os.fsync, []

    def fsync(fd):
        synced_before_place.append(list(digests_in(store)))
        real_fsync(fd)

    monkeypatch.setattr(payloads, "_SYNCFS", None)
    monkeypatch.setattr(payloads.os, "fsync", fsync)
    batch = store.batch()
    batch.put(DOC)
    batch.put(b"second")
    batch.commit()
    assert synced_before_place[:2] == [[], []]  # both data fsyncs before any rename
    with store.open(sha(DOC)) as a, store.open(sha(b"second")) as b:
        assert (a.read(), b.read()) == (DOC, b"second")


@pytest.mark.parametrize("left", [b"\x00" * len(DOC), DOC[:-1] + b"?"])
@pytest.mark.parametrize("how", ["put", "batch"])
def test_a_file_under_its_digest_with_other_bytes_of_the_same_size_is_replaced(
        store, backend_of_store, left, how):
    """What a crash between rename and sync may leave (zeros, or bytes never written)
    is never taken for the content: storing it again replaces the file."""
    stored = store.put(DOC)
    backend_of_store.overwrite(stored.digest, left)
    if how == "put":
        assert store.put(DOC) == stored
    else:
        batch = store.batch()
        batch.put(DOC)
        batch.commit()
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC
    assert backend_of_store.temp_files() == []


# --- a batch taking an open file by a hard link ---------------------------------------

@pytest.fixture
def dropped(store, tmp_path):
    """A file on the store's file system, as a poller finds it (written a while ago)."""
    path = tmp_path / "inbox" / "order.xml"
    path.parent.mkdir()
    path.write_bytes(DOC)
    age(path, 7200)
    return path


@fs_only
def test_a_batch_links_an_open_file_and_hashes_the_bytes_it_stores(store, dropped):
    seen = dropped.stat()
    batch = store.batch()
    with dropped.open("rb") as stream:
        stored = batch.put(stream, chunk_size=1000, link=dropped)
    assert stored == StoredPayload(sha(DOC), len(DOC))
    linked = temp_files(store)
    assert [p.stat().st_ino for p in linked] == [seen.st_ino]  # no copy was made
    assert not store.exists(stored.digest)

    batch.commit()
    placed = store.path(stored.digest).stat()
    assert (placed.st_ino, placed.st_nlink) == (seen.st_ino, 2)
    assert temp_files(store) == []
    # The caller's checks of size and mtime still see the file it picked up.
    assert (dropped.stat().st_size, dropped.stat().st_mtime_ns) == (
        seen.st_size, seen.st_mtime_ns)
    dropped.unlink()  # the caller removes its name after its commit
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC
    assert store.path(stored.digest).stat().st_nlink == 1


@fs_only
def test_a_linked_payload_counts_its_age_from_the_link(store, dropped):
    """The file's mtime is old; the cleanups must not take the new payload (not yet
    referenced: its transaction commits after the batch) nor its temp link for old."""
    batch = store.batch()
    with dropped.open("rb") as stream:
        stored = batch.put(stream, link=dropped)
    assert store.remove_stale_temp(older_than_seconds=3600) == 0
    assert len(temp_files(store)) == 1
    batch.commit()
    assert store.path(stored.digest).stat().st_mtime < time.time() - 3600
    assert sweep(store, set(), older_than_seconds=3600) == 0
    assert store.exists(stored.digest)


@fs_only
def test_a_file_with_another_name_is_copied(store, dropped, tmp_path):
    other = tmp_path / "inbox" / "kept-elsewhere.xml"
    os.link(dropped, other)
    batch = store.batch()
    with dropped.open("rb") as stream:
        stored = batch.put(stream, link=dropped)
    batch.commit()
    assert store.path(stored.digest).stat().st_ino != dropped.stat().st_ino
    assert dropped.stat().st_nlink == 2  # no name of ours is left on it
    other.write_bytes(b"changed through the other name")
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC


@fs_only
@pytest.mark.parametrize("error", [errno.EXDEV, errno.EPERM, errno.ENOENT, errno.EMLINK])
def test_a_link_that_fails_falls_back_to_a_copy(store, dropped, monkeypatch, error):
    def refuse(*args, **kwargs):
        raise OSError(error, os.strerror(error))
    monkeypatch.setattr(payloads.os, "link", refuse)
    batch = store.batch()
    with dropped.open("rb") as stream:
        stored = batch.put(stream, link=dropped)
    assert [p.name[:4] for p in temp_files(store)] == ["put-"]
    batch.commit()
    assert stored == StoredPayload(sha(DOC), len(DOC))
    assert store.path(stored.digest).stat().st_ino != dropped.stat().st_ino
    assert dropped.stat().st_nlink == 1


def test_a_stream_without_a_file_is_copied(store, tmp_path):
    batch = store.batch()
    stored = batch.put(io.BytesIO(DOC), link=tmp_path / 'no-such-file')
    batch.commit()
    assert stored == StoredPayload(sha(DOC), len(DOC))


@fs_only
def test_a_link_left_by_a_dead_process_is_removed_once_stale(store, dropped):
    """A process that dies between the link and the commit leaves the link in tmp and
    the file where it was; the file is taken again, the link removed when stale."""
    batch = store.batch()
    with dropped.open("rb") as stream:
        batch.put(stream, link=dropped)
    # the process dies here: nothing committed, nothing discarded
    [left] = temp_files(store)
    assert store.remove_stale_temp(older_than_seconds=3600) == 0
    age(left, 7200)
    assert store.remove_stale_temp(older_than_seconds=3600) == 1
    assert temp_files(store) == []
    assert dropped.read_bytes() == DOC and dropped.stat().st_nlink == 1


@fs_only
def test_a_dropped_link_leaves_the_file_alone(store, dropped):
    batch = store.batch()
    with dropped.open("rb") as stream:
        stored = batch.put(stream, link=dropped)
    batch.drop(stored)
    assert temp_files(store) == []
    assert dropped.read_bytes() == DOC and dropped.stat().st_nlink == 1


@fs_only
def test_directories_are_made_when_missing_not_before_each_payload(store, monkeypatch):
    """The temp and shard directories are created when a write finds them missing
    (even removed by hand after the first payload), not by a mkdir per payload."""
    store.put(b"first")
    (store.root / "tmp").rmdir()
    made = []
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        made.append(os.fspath(path))
        return real_mkdir(path, *args, **kwargs)
    monkeypatch.setattr(os, "mkdir", mkdir)
    batch = store.batch()
    one, two = batch.put(DOC), batch.put(DOC[::-1])
    batch.commit()
    again = store.put(DOC + b"more")
    assert made.count(str(store.root / "tmp")) == 1
    for stored in (one, two, again):
        assert store.open(stored.digest).read() in (DOC, DOC[::-1], DOC + b"more")
    shards = {str(store.path(s.digest).parent) for s in (one, two, again)}
    # a new shard: one failed mkdir of <ab>/<cd>, then <ab>, then <ab>/<cd>
    assert shards <= set(made) and len(made) <= 1 + 3 * len(shards)


@fs_only
def test_a_link_whose_age_cannot_be_set_is_copied(store, dropped, monkeypatch):
    def refuse(fd):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(payloads, "_touch_atime", refuse)
    batch = store.batch()
    with dropped.open("rb") as stream:
        stored = batch.put(stream, link=dropped)
    batch.commit()
    assert stored == StoredPayload(sha(DOC), len(DOC))
    assert store.path(stored.digest).stat().st_ino != dropped.stat().st_ino
    assert dropped.stat().st_nlink == 1


@fs_only
def test_a_read_failing_after_the_link_is_not_taken_for_a_copy(store, dropped):
    """Once the linked file is being read, a failure is the read's: no copy of a stream
    already partly read, and no link left behind."""
    class FailsOnce(io.BufferedReader):
        """Its second read fails; later reads go on where the first one ended."""
        reads = 0

        def read(self, size=-1):
            self.reads += 1
            if self.reads == 2:
                raise PermissionError(13, "Permission denied")
            return super().read(size)
    batch = store.batch()
    with FailsOnce(io.FileIO(dropped, "rb")) as stream, pytest.raises(PermissionError):
        batch.put(stream, chunk_size=1000, link=dropped)
    assert temp_files(store) == [] and len(batch) == 0
    assert dropped.stat().st_nlink == 1


# --- the S3 store: multipart uploads, temporary keys, a process killed mid-upload -------

BIG = 12 * 1024 * 1024  # three parts of the smallest size S3 takes


@s3_only
def test_a_large_payload_goes_up_in_parts_to_a_temporary_key_until_the_commit(
        store, backend_of_store):
    batch = store.batch()
    stored = batch.put(PatternStream(BIG))
    assert stored.size == BIG
    assert not store.exists(stored.digest)
    assert len(store.temp_objects()) == 1 and store.temp_uploads() == []

    batch.commit()
    assert backend_of_store.temp_files() == []
    assert store.size(stored.digest) == BIG
    with store.open(stored.digest) as stream:
        assert hashlib.sha256(b"".join(stream)).hexdigest() == stored.digest
        assert stream.verified


@s3_only
def test_a_failing_stream_aborts_its_upload(store, backend_of_store):
    class Fails(PatternStream):
        def read(self, n=-1):
            if self.given > BIG // 2:
                raise OSError(5, "Input/output error")
            return super().read(n)
    with pytest.raises(OSError):
        store.put(Fails(BIG))
    assert backend_of_store.temp_files() == [] and list(digests_in(store)) == []


def test_a_batch_past_its_memory_sends_payloads_to_temporary_keys(s3_server):
    store = s3_server.store(batch_memory=len(DOC) + 10)
    batch = store.batch()
    first, second, third = (batch.put(DOC), batch.put(DOC[::-1]), batch.put(DOC + b"3"))
    assert len(store.temp_objects()) == 2  # the first is held in memory
    assert not any(store.exists(s.digest) for s in (first, second, third))
    batch.commit()
    assert sorted(digests_in(store)) == sorted(s.digest for s in (first, second, third))
    assert store.temp_objects() == []

    batch.put(DOC + b"4")  # held
    fifth = batch.put(DOC + b"5")  # past the memory again
    assert len(store.temp_objects()) == 1
    batch.drop(fifth)
    assert store.temp_objects() == []
    batch.put(DOC + b"6")
    assert len(store.temp_objects()) == 1
    batch.discard()
    assert store.temp_objects() == [] and len(list(digests_in(store))) == 3


@s3_only
def test_kill_9_in_the_middle_of_a_multipart_upload_leaves_nothing_referenced_and_the_cleanup_aborts_it(  # noqa: E501
        store, backend_of_store):
    """A process killed while sending the parts of a payload leaves an unfinished upload
    (its parts kept by the server) and nothing under any digest, so no row can refer to
    it; the orphan cleanup aborts it once older than its margin, not before."""
    part = 8 * 1024 * 1024  # the store's default part size
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.payload_child", str(5 * part),
         "--hang-after", str(2 * part + 1)],
        env={**os.environ, **backend_of_store.env()}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "hanging", child.stderr.read()
    finally:
        child.kill()  # SIGKILL: no cleanup of its own
        child.wait(10)

    [upload] = store.temp_uploads()
    parts = store.client.list_parts(Bucket=store.bucket, Key=upload["Key"],
                                    UploadId=upload["UploadId"])["Parts"]
    assert [p["PartNumber"] for p in parts] == [1, 2]
    assert list(digests_in(store)) == [] and store.temp_objects() == []

    assert sweep(store, set(), older_than_seconds=3600) == 0  # may be under way
    assert len(store.temp_uploads()) == 1

    store.clock = lambda: time.time() + 7200  # two hours later
    assert sweep(store, set(), older_than_seconds=3600) == 1
    assert store.temp_uploads() == []
    with pytest.raises(store.client.exceptions.NoSuchUpload):
        store.client.list_parts(Bucket=store.bucket, Key=upload["Key"],
                                UploadId=upload["UploadId"])


@s3_only
def test_stale_temporary_objects_and_uploads_go_with_remove_stale_temp(store):
    store.client.create_multipart_upload(Bucket=store.bucket, Key=store._temp_key())
    batch = store.batch()
    batch.put(PatternStream(BIG))  # a dead process's upload, completed to its temp key
    assert store.remove_stale_temp() == 0
    store.clock = lambda: time.time() + 2 * payloads.TEMP_GRACE
    assert store.remove_stale_temp() == 2
    assert store.temp_objects() == [] and store.temp_uploads() == []


# --- which store a process uses ---------------------------------------------------------

def test_the_payload_url_chooses_the_store(tmp_path, s3_server):
    from b2bhub.payloads.backends import open_payload_store
    from b2bhub.payloads.s3 import S3PayloadStore

    default = open_payload_store(None, tmp_path / "dir")
    assert isinstance(default, PayloadStore) and default.root == tmp_path / "dir"
    for url in (str(tmp_path / "elsewhere"), f"file://{tmp_path}/elsewhere"):
        chosen = open_payload_store(url, tmp_path / "dir")
        assert isinstance(chosen, PayloadStore) and chosen.root == tmp_path / "elsewhere"
    s3 = open_payload_store("s3://bucket/some/prefix/", tmp_path,
                            endpoint_url=s3_server.endpoint_url)
    assert isinstance(s3, S3PayloadStore)
    assert (s3.bucket, s3.prefix, s3.endpoint_url) == ("bucket", "some/prefix",
                                                        s3_server.endpoint_url)
    assert s3.key(sha(b"x")) == f"some/prefix/{sha(b'x')}"


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "ftp://host/dir",
                                 "file://otherhost/dir"])
def test_a_payload_url_that_names_no_store_is_refused_by_name(tmp_path, url):
    from b2bhub.payloads.backends import open_payload_store

    with pytest.raises(ValueError, match="B2BHUB_PAYLOAD_URL"):
        open_payload_store(url, tmp_path)


def test_the_hub_stores_payloads_where_the_payload_url_says(s3_server, monkeypatch, tmp_path):
    from b2bhub import create_app
    from tests.s3kit import new_bucket

    bucket = new_bucket()
    for name, value in s3_server.env(bucket).items():
        monkeypatch.setenv(name, value)
    s3_server.store(bucket).client.create_bucket(Bucket=bucket)
    app = create_app({"TESTING": True, "DATA_DIR": str(tmp_path),
                      "SQLALCHEMY_DATABASE_URI": f"sqlite:///{tmp_path / 'db.sqlite'}",
                      "SECRET_KEY": "test"})
    stored = app.extensions["b2bhub.store"].put(DOC)
    with s3_server.store(bucket).open(stored.digest) as stream:
        assert stream.read() == DOC
    assert not (tmp_path / "payloads").exists()


# --- reading a claimed batch's payloads ahead -------------------------------------------

def gets_of(store) -> list[tuple[str, int]]:
    """(key, thread) of each GetObject the store sends from now on: observed on the
    store's own request hooks, called in the thread that sends it, the requests still
    made to the server (whether signed by the store or by its client)."""
    seen: list[tuple[str, int]] = []
    store.request_hooks.append(
        lambda operation, key: seen.append((key.rsplit("/", 1)[-1], threading.get_ident()))
        if operation == "GetObject" else None)
    return seen


def test_only_the_s3_store_reads_ahead(store):
    from b2bhub.payloads.s3 import S3PayloadStore

    stored = store.put(DOC)
    assert store.reads_ahead is isinstance(store, S3PayloadStore)
    if not store.reads_ahead:  # a local file costs no round trip to save
        assert store.read_ahead({stored.digest: stored.size}) == {}


def test_read_ahead_gets_the_small_payloads_together_and_leaves_out_the_rest(s3_server):
    store = s3_server.store(read_ahead_size=len(DOC) + 1)
    assert s3_server.store().read_ahead_size == 1024 * 1024  # by default
    small = [store.put(DOC + bytes([n])) for n in range(3)]
    big = store.put(DOC + b"too big")
    missing = sha(b"never stored")
    misrecorded = store.put(DOC[:100])  # its row says another size than the object has
    wanted = {s.digest: s.size for s in [*small, big]}
    wanted |= {missing: 10, misrecorded.digest: misrecorded.size + 1}
    together = threading.Barrier(len(small) + 2, timeout=30)  # the small, missing, short

    def all_under_way(operation, key) -> None:  # passes only when every GET is sent at once
        if operation == "GetObject":
            together.wait()
    store.request_hooks.append(all_under_way)
    seen = gets_of(store)

    got = store.read_ahead(wanted)

    assert got == {s.digest: DOC + bytes([n]) for n, s in enumerate(small)}
    assert sorted(key for key, _ in seen) == sorted(
        [s.digest for s in small] + [missing, misrecorded.digest])  # never the big one
    assert not together.broken


def test_read_ahead_takes_no_more_than_the_batch_memory_in_the_order_asked(s3_server):
    store = s3_server.store(batch_memory=2 * len(DOC) + 4)
    stored = [store.put(DOC[:len(DOC) - n]) for n in range(5)]
    seen = gets_of(store)
    got = store.read_ahead({s.digest: s.size for s in stored})
    assert list(got) == [s.digest for s in stored[:2]]  # a third would pass the memory
    assert sum(map(len, got.values())) <= store.batch_memory
    assert sorted(key for key, _ in seen) == sorted(s.digest for s in stored[:2])
    one_more = store.put(b"small")  # 5 bytes: the memory exactly
    assert list(store.read_ahead({**{s.digest: s.size for s in stored},
                                  one_more.digest: one_more.size})) == [
        stored[0].digest, stored[1].digest, one_more.digest]  # fits beside the first two


def test_a_corrupt_object_read_ahead_raises_what_its_open_raises(s3_server):
    from b2bhub.engine.runner import ReadAhead, StoredPayloads

    store = s3_server.store()
    good, bad, large = store.put(DOC), store.put(DOC[::-1]), store.put(b"L" * (2 << 20))
    flipped = bytearray(DOC[::-1])
    flipped[100] ^= 0x01
    store.client.put_object(Bucket=store.bucket, Key=store.key(bad.digest),
                            Body=bytes(flipped))  # same length, another sha256
    batch = [{"unpacked": (s.digest, s.size)} for s in (good, bad, large, good)]
    ahead = ReadAhead(store, batch)
    payloads = [StoredPayloads(store, stages, ahead, n) for n, stages in enumerate(batch)]
    seen = gets_of(store)

    with payloads[0].open("unpacked") as stream:
        assert stream.read() == DOC and stream.verified
    assert sorted(key for key, _ in seen) == sorted([good.digest, bad.digest])  # at once
    with payloads[1].open("unpacked") as stream, pytest.raises(PayloadCorrupt) as ahead_info:
        stream.read()
    assert len(seen) == 2  # read ahead, not opened again
    with store.open(bad.digest) as stream, pytest.raises(PayloadCorrupt) as open_info:
        stream.read()
    assert (type(ahead_info.value), str(ahead_info.value), ahead_info.value.actual) == (
        type(open_info.value), str(open_info.value), open_info.value.actual)

    del seen[:]
    with payloads[2].open("unpacked") as stream:  # past read_ahead_size: opened
        assert len(stream.read()) == large.size and stream.verified
    with payloads[3].open("unpacked") as stream:  # handed out once: opened again
        assert stream.read() == DOC and stream.verified
    assert [key for key, _ in seen] == [large.digest, good.digest]


def test_a_claimed_batch_is_delivered_from_s3_with_its_payloads_read_ahead(
        s3_server, hub, session, registry, record_dir):
    """Four deliveries claimed together: their payloads come in parallel GETs made at
    the first attempt's open, every body reaches the target intact, and the one whose
    object was corrupted fails its attempt with the store's integrity error."""
    import json

    from sqlalchemy import select

    from b2bhub.engine.runner import TargetRunner
    from b2bhub.models import Delivery
    from b2bhub.runtime.hub import new_session

    hub.store = store = s3_server.store()
    hub.parties()
    hub.instance("inbox", "manual_source")
    hub.instance("out", "recorder", config={"record_dir": str(record_dir), "claim_batch": 4})
    hub.route("inbox", "*", "*", "out")
    bodies = [DOC + bytes([n]) for n in range(4)]
    messages = [hub.message(body=body) for body in bodies]
    corrupt = sha(bodies[2])
    store.client.put_object(Bucket=store.bucket, Key=store.key(corrupt),
                            Body=bodies[2][:-1] + b"?")
    seen = gets_of(store)

    report = TargetRunner(new_session, registry, store, "test-owner").drain("out", 10)

    assert report.claimed == 4
    assert sorted(key for key, _ in seen) == sorted(sha(body) for body in bodies)
    assert threading.get_ident() not in {thread for _, thread in seen}  # none in series
    records = [json.loads(line) for path in record_dir.iterdir()
               for line in path.read_text().splitlines()]
    assert sorted(r["sha256"] for r in records) == sorted(sha(b) for b in bodies[:2] + bodies[3:])
    session.expire_all()
    rows = {d.message_id: d for d in session.scalars(select(Delivery))}
    assert [rows[m.id].state for m in messages] == ["delivered", "delivered", "retrying",
                                                    "delivered"]
    assert f"payload {corrupt}: corrupt" in rows[messages[2].id].last_result
