"""Stores a stream of pseudo-random bytes in a payload store from a process of its own
(the store ``B2BHUB_PAYLOAD_URL`` names, on ``B2BHUB_S3_ENDPOINT_URL`` for s3://), so
its memory is measured apart from a test's S3 server, or it can be killed mid-write.

``python -m tests.payload_child SIZE`` prints ``<digest> <size> <peak traced bytes>``;
with ``--hang-after BYTES`` it prints ``hanging`` once that much was read and waits to be
killed, the write unfinished.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import tracemalloc


class PatternStream:
    """A binary stream of ``size`` pseudo-random bytes that is never held in memory."""

    def __init__(self, size: int, hang_after: int | None = None):
        self.left = size
        self.given = 0
        self.hang_after = hang_after
        self.block = hashlib.sha256(b"seed").digest() * 2048  # 64 KiB

    def read(self, n: int = -1) -> bytes:
        if self.hang_after is not None and self.given >= self.hang_after:
            print("hanging", flush=True)
            while True:
                time.sleep(60)
        n = min(self.left, len(self.block) if n < 0 else n, len(self.block))
        self.left -= n
        self.given += n
        return self.block[:n]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("size", type=int)
    parser.add_argument("--hang-after", type=int)
    args = parser.parse_args()
    from b2bhub.payloads.backends import open_payload_store

    store = open_payload_store(os.environ["B2BHUB_PAYLOAD_URL"], "",
                               endpoint_url=os.environ.get("B2BHUB_S3_ENDPOINT_URL"))
    if hasattr(store, "client"):
        store.client  # noqa: B018  (made before the measure: not the payload's memory)
    tracemalloc.start()
    stored = store.put(PatternStream(args.size, args.hang_after))
    _current, peak = tracemalloc.get_traced_memory()
    print(stored.digest, stored.size, peak)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
