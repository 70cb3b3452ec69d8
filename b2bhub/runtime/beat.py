"""Beat's scheduler: Celery's persistent one, made to recover from a broken producer.

Celery's beat makes one connection and one producer and keeps both for its life. When a
publish leaves the producer's channel closed (seen on the embedded SQLite broker: a
first publish failed while the broker's file was busy, and kombu's recovery left the
producer on the closed channel), every later publish fails with "channel disconnected"
and no periodic task is sent again: no scans, no sweeps, until beat is restarted.

Here a failed publish drops the producer and the connection and tries once more on new
ones; if that fails too, the error is logged as before and the next due entry starts
from new ones again. A tick lost is only a tick: every periodic task is a wake-up of
work the database holds.
"""

from __future__ import annotations

import logging

from celery.beat import PersistentScheduler

log = logging.getLogger(__name__)


class Scheduler(PersistentScheduler):
    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        entry = self.reserve(entry) if advance else entry  # once, not again on the retry
        try:
            return super().apply_async(entry, producer=producer, advance=False, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure: start over on a new connection
            log.warning("beat: publishing %s failed (%s); publishing again on a new "
                        "connection", entry.name, exc)
            self._drop_connection()
            try:
                return super().apply_async(entry, producer=self.producer, advance=False,
                                           **kwargs)
            except Exception:
                self._drop_connection()  # the next entry starts from new ones again
                raise

    def _drop_connection(self) -> None:
        connection = self.__dict__.pop("connection", None)
        self.__dict__.pop("producer", None)
        if connection is not None:
            try:
                connection.release()
            except Exception:  # noqa: BLE001 - it is broken already; a new one is made
                log.debug("beat: releasing the broken connection failed", exc_info=True)
