"""The payload store keeps bytes by sha256, streams them both ways and never hands out
corrupt or half-written content."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import time
import tracemalloc

import pytest

from b2bhub import payloads
from b2bhub.payloads import PayloadCorrupt, PayloadMissing, PayloadStore, StoredPayload

DOC = b"UNB+UNOC:3+SENDER+RECEIVER+240101:1200+1'\n" * 1000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(tmp_path):
    return PayloadStore(tmp_path / "payloads")


def age(path, seconds: float) -> None:
    """Make a file look ``seconds`` old."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_bytes_round_trip(store):
    stored = store.put(DOC)
    assert stored == StoredPayload(sha(DOC), len(DOC))
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC
    assert store.path(stored.digest).relative_to(store.root).parts == (
        stored.digest[:2],
        stored.digest[2:4],
        stored.digest,
    )
    assert store.size(stored.digest) == len(DOC)


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


def test_identical_content_is_stored_once(store):
    first = store.put(DOC)
    second = store.put(io.BytesIO(DOC))
    assert first == second
    assert list(store.iter_digests()) == [first.digest]
    assert list((store.root / "tmp").iterdir()) == []


def test_text_stream_is_refused_and_leaves_no_temp_file(store):
    with pytest.raises(TypeError):
        store.put(io.StringIO("text"))
    assert list((store.root / "tmp").iterdir()) == []


def test_flipped_byte_on_disk_is_detected_at_end_of_read(store):
    stored = store.put(DOC)
    path = store.path(stored.digest)
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))

    with store.open(stored.digest) as stream, pytest.raises(PayloadCorrupt) as info:
        stream.read()
    assert info.value.digest == stored.digest
    with store.open(stored.digest) as stream, pytest.raises(PayloadCorrupt):
        b"".join(stream)


def test_truncated_file_is_detected_and_repaired_by_a_new_put(store):
    stored = store.put(DOC)
    store.path(stored.digest).write_bytes(DOC[:-1])
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
    assert store.delete(digest) is False


def test_delete(store):
    stored = store.put(DOC)
    assert store.exists(stored.digest)
    assert store.delete(stored.digest) is True
    assert not store.exists(stored.digest)


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
def test_bad_digest_is_refused(store, digest):
    for call in (store.path, store.open, store.exists, store.size, store.delete):
        with pytest.raises(ValueError):
            call(digest)


class PatternStream:
    """A binary stream of ``size`` pseudo-random bytes that is never held in memory."""

    def __init__(self, size: int):
        self.left = size
        self.block = hashlib.sha256(b"seed").digest() * 2048  # 64 KiB

    def read(self, n: int = -1) -> bytes:
        n = min(self.left, len(self.block) if n < 0 else n, len(self.block))
        self.left -= n
        return self.block[:n]


def test_large_stream_is_stored_with_little_memory(store):
    size = 50 * 1024 * 1024
    expected = hashlib.sha256()
    source = PatternStream(size)
    while chunk := source.read(1 << 16):
        expected.update(chunk)

    tracemalloc.start()
    try:
        stored = store.put(PatternStream(size))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert stored == StoredPayload(expected.hexdigest(), size)
    assert peak < 5 * 1024 * 1024
    assert store.path(stored.digest).stat().st_size == size


def test_orphan_removal_respects_grace_period(store):
    kept = store.put(b"referenced")
    young = store.put(b"written just before its transaction commits")
    old = store.put(b"orphan from a rolled back transaction")
    for stored in (kept, old):
        age(store.path(stored.digest), 7200)

    removed = store.remove_orphans({kept.digest}, older_than_seconds=3600)

    assert removed == 1
    assert sorted(store.iter_digests()) == sorted([kept.digest, young.digest])


def test_orphan_removal_takes_a_predicate(store):
    stored = store.put(b"orphan")
    age(store.path(stored.digest), 10)
    assert store.remove_orphans(lambda digest: False, older_than_seconds=5) == 1
    assert not store.exists(stored.digest)


def test_putting_an_old_orphan_again_renews_its_grace_period(store):
    stored = store.put(DOC)
    age(store.path(stored.digest), 7200)
    store.put(DOC)
    assert store.remove_orphans(set(), older_than_seconds=3600) == 0
    assert store.exists(stored.digest)


def test_old_temp_files_are_removed_and_fresh_ones_kept(store):
    store.put(b"creates the tmp folder")
    tmp = store.root / "tmp"
    (tmp / "put-old").write_bytes(b"interrupted")
    (tmp / "put-new").write_bytes(b"being written")
    age(tmp / "put-old", 7200)
    stray = store.root / "ab" / "README"
    stray.parent.mkdir()
    stray.write_text("not a payload")
    age(stray, 7200)

    removed = store.remove_orphans(lambda digest: True, older_than_seconds=3600)

    assert removed == 1
    assert sorted(p.name for p in tmp.iterdir()) == ["put-new"]
    assert stray.exists()


def test_iter_digests_on_an_empty_store(store):
    assert list(store.iter_digests()) == []
    assert store.remove_orphans(set()) == 0


# --- a batch: durability paid once, nothing in place before the commit ---------------

def temp_files(store) -> list:
    tmp = store.root / "tmp"
    return sorted(tmp.iterdir()) if tmp.is_dir() else []


def test_a_batch_puts_nothing_in_place_before_its_commit(store):
    batch = store.batch()
    first = batch.put(DOC)
    second = batch.put(io.BytesIO(DOC[::-1]), chunk_size=1000)
    assert (first, second) == (StoredPayload(sha(DOC), len(DOC)),
                               StoredPayload(sha(DOC[::-1]), len(DOC)))
    assert not store.exists(first.digest) and not store.exists(second.digest)

    batch.commit()
    with store.open(first.digest) as a, store.open(second.digest) as b:
        assert (a.read(), b.read()) == (DOC, DOC[::-1])
    assert temp_files(store) == []
    assert len(batch) == 0


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


def test_a_batch_keeps_one_copy_of_content_already_stored_or_put_twice(store):
    store.put(DOC)
    batch = store.batch()
    batch.put(DOC)
    batch.put(b"twice")
    batch.put(b"twice")
    batch.commit()
    assert sorted(store.iter_digests()) == sorted([sha(DOC), sha(b"twice")])
    assert temp_files(store) == []


def test_a_dropped_or_discarded_payload_leaves_nothing(store):
    batch = store.batch()
    kept = batch.put(b"kept")
    batch.drop(batch.put(b"changed while read"))
    batch.commit()
    assert list(store.iter_digests()) == [kept.digest]

    batch.put(b"never committed")
    batch.discard()
    batch.commit()
    assert list(store.iter_digests()) == [kept.digest]
    assert temp_files(store) == []


def test_a_batch_whose_put_fails_keeps_the_others(store):
    batch = store.batch()
    batch.put(b"one")
    with pytest.raises(TypeError):
        batch.put(io.StringIO("text"))
    batch.commit()
    assert list(store.iter_digests()) == [sha(b"one")]
    assert temp_files(store) == []


def test_a_batch_renames_into_place_then_syncs_once(store, monkeypatch):
    """Where syncfs exists, one call makes the data and the new names durable: it comes
    after every payload is in place, and no file is fsynced on its own."""
    from b2bhub import payloads

    calls = []

    def fake_syncfs(fd):
        calls.append(sorted(store.iter_digests()))
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


def test_a_failed_sync_raises_and_leaves_no_temp_file(store, monkeypatch):
    from b2bhub import payloads

    monkeypatch.setattr(payloads, "_SYNCFS", lambda fd: -1)
    batch = store.batch()
    batch.put(DOC)
    with pytest.raises(OSError):
        batch.commit()
    assert temp_files(store) == []


def test_without_syncfs_a_batch_fsyncs_each_file_before_its_rename(store, monkeypatch):
    from b2bhub import payloads

    real_fsync, synced_before_place = os.fsync, []

    def fsync(fd):
        synced_before_place.append(list(store.iter_digests()))
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
        store, left, how):
    """What a crash between rename and sync may leave (zeros, or bytes never written)
    is never taken for the content: storing it again replaces the file."""
    stored = store.put(DOC)
    store.path(stored.digest).write_bytes(left)
    if how == "put":
        assert store.put(DOC) == stored
    else:
        batch = store.batch()
        batch.put(DOC)
        batch.commit()
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC
    assert temp_files(store) == []


# --- a batch taking an open file by a hard link ---------------------------------------

@pytest.fixture
def dropped(store, tmp_path):
    """A file on the store's file system, as a poller finds it (written a while ago)."""
    path = tmp_path / "inbox" / "order.xml"
    path.parent.mkdir()
    path.write_bytes(DOC)
    age(path, 7200)
    return path


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
    assert store.remove_orphans(set(), older_than_seconds=3600) == 0
    assert store.exists(stored.digest)


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


def test_a_stream_without_a_file_is_copied(store):
    batch = store.batch()
    stored = batch.put(io.BytesIO(DOC), link=store.root / 'no-such-file')
    batch.commit()
    assert stored == StoredPayload(sha(DOC), len(DOC))


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


def test_a_dropped_link_leaves_the_file_alone(store, dropped):
    batch = store.batch()
    with dropped.open("rb") as stream:
        stored = batch.put(stream, link=dropped)
    batch.drop(stored)
    assert temp_files(store) == []
    assert dropped.read_bytes() == DOC and dropped.stat().st_nlink == 1


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
