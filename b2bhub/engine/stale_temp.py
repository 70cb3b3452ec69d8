"""The payload store's temporary files a dead process left, removed by source scans at
most once an hour per process and store (``SourceIntake.recover_files``)."""

from __future__ import annotations

import logging
from time import monotonic

from b2bhub.payloads.store import PayloadStore

log = logging.getLogger(__name__)
TEMP_CHECK_INTERVAL = 3600.0


def remove_stale_temp(store: PayloadStore, instance: str, checked: dict[str, float]
                      ) -> None:
    """Ask the store to remove its stale temp files unless ``checked`` (payload store
    root -> monotonic time of the last check) says it was done within the hour."""
    # the filesystem store's root, or an object store's URL
    root = str(getattr(store, "root", None) or getattr(store, "url", id(store)))
    last = checked.get(root)
    if last is not None and monotonic() - last < TEMP_CHECK_INTERVAL:
        return
    checked[root] = monotonic()
    try:
        removed = store.remove_stale_temp()
    except Exception as exc:  # a disk's OSError, an object store's client error: next time
        log.warning("%s: the payload store's temp files could not be cleaned: %s",
                    instance, exc)
        return
    if removed:
        log.info("%s: removed %d temp files of the payload store left by a process "
                 "that stopped", instance, removed)
