"""What the intake does with a file after its commit, and after a crash: remove it,
make the removal durable, tell a recorded file from a changed one (``intake.py``)."""

from __future__ import annotations

import hashlib
import logging

from b2bhub.models import PollerPickup
from b2bhub.plugin import PickedFile

log = logging.getLogger("b2bhub.engine.intake")


def removals_durable(files: list[PickedFile], instance: str) -> list[PickedFile]:
    """Make removals durable before their pickup rows may go (a removal lost in a crash
    would bring back a file the hub no longer knows it stored): the files' own
    ``sync_removal``, called once per ``directory`` they name. Returns the files whose
    removal is durable."""
    done: dict[object, bool] = {}
    for file in files:
        sync = getattr(file, "sync_removal", None)
        key = getattr(file, "directory", id(file))
        if sync is None or key in done:
            continue
        try:
            sync()
            done[key] = True
        except OSError as exc:
            log.warning("%s: the removal of %s could not be made durable: %s; its "
                        "pickup is kept", instance, file.relative, exc)
            done[key] = False
    return [f for f in files if done.get(getattr(f, "directory", id(f)), True)]


def same_file(file: PickedFile, row: PollerPickup) -> bool:
    """The file still is the one recorded: same size, mtime and content."""
    if (file.size, file.mtime_ns) != (row.size, row.mtime_ns):
        return False
    if getattr(file, "keep", False):  # its memory: by path, size and mtime, unread
        return True
    try:
        with file.open() as stream:
            return hashlib.file_digest(stream, "sha256").hexdigest() == row.sha256
    except OSError:
        return False


def removed(file: PickedFile, instance: str) -> bool:
    """Remove a stored file; True once it is gone or replaced, False if it must stay
    recorded (the removal failed, so the next scan tries again rather than store it; or
    the file is kept in place, its row the memory that it was taken)."""
    if getattr(file, "keep", False):
        return False
    try:
        if not file.remove():
            log.info("%s: %s changed after it was stored; left for the next scan",
                     instance, file.relative)
        return True
    except OSError as exc:
        log.warning("%s: %s was stored but could not be removed: %s", instance,
                    file.relative, exc)
        return False
