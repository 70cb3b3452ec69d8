"""A claimer's turn at a target: the lanes of its Max Concurrent Deliveries.

:func:`lock_target` gives the claimer its :class:`Turn` for the transaction (on
PostgreSQL the instance row held FOR SHARE and one lane's lock), and the live-lease count
of the claim statements (:mod:`.claiming`) is charged to that lane. Nothing here writes
``deliveries.state``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, literal_column, select, text
from sqlalchemy.orm import Session

from b2bhub.engine.driver import DriverSQL
from b2bhub.engine.history import connection
from b2bhub.engine.machine.common import _is_postgres
from b2bhub.models import PluginInstance

#: Lanes of a target's Max Concurrent Deliveries (PostgreSQL, see :func:`lock_target`):
#: about this many live leases each (the largest claim batch of the bundled plugins),
#: and at most LANES_MAX of them
LANE_SIZE = 16
LANES_MAX = 8


# The live leases the claimer's lane is charged with: its own, and what any other lane
# has beyond its share. A lane can only be beyond its share after the maximum (or the
# split) changed under live leases, and then only until they end: without the charge, a
# lane with room would claim its whole share while another is still over, and together
# they would pass the new maximum. Other lanes' claimers never put their lane beyond its
# share, and only settlements change a lane that is (it gets no claims), so a count of
# them taken in an older snapshot can only charge too much, never too little. One scan
# of the target's live leases, a count per lane (no sort).
_LANE_OF = "coalesce(x.lane, 0) % :lanes"


def _lane_charge_sql() -> str:
    share = "(:total / :lanes + CASE WHEN {k} < :total % :lanes THEN 1 ELSE 0 END)"
    beyond = " + ".join(
        f"CASE WHEN :lane <> {k} AND c.n{k} > {share.format(k=k)} "
        f"THEN c.n{k} - {share.format(k=k)} ELSE 0 END" for k in range(LANES_MAX))
    counts = ", ".join(f"count(*) FILTER (WHERE {_LANE_OF} = {k}) AS n{k}"
                       for k in range(LANES_MAX))
    return f"""
       SELECT c.own + {beyond}
         FROM (SELECT count(*) FILTER (WHERE {_LANE_OF} = :lane) AS own, {counts}
                 FROM deliveries x
                WHERE x.target = :target AND x.state = 'in_progress') AS c"""


_LANE_CHARGE = _lane_charge_sql()

_INSTANCE = PluginInstance.__table__
_READ_TARGET = select(_INSTANCE).where(_INSTANCE.c.name == bindparam("name"))

# Lanes (PostgreSQL). A target's Max Concurrent Deliveries is split into lanes of about
# LANE_SIZE (at most LANES_MAX; an ordered target has one): lane k of L may have
# max // L live leases, one more for k < max % L, so the lanes' shares add up to the
# maximum. A claimer takes one lane's transaction lock (an advisory lock keyed by the
# instance's id and the lane) and counts only that lane's live leases: claimers of one
# target claim side by side in different lanes instead of taking turns on its row, and
# in each lane the count is exact, because its claimers take turns on its lock and each
# counts in a snapshot taken after the lock (the claim statement's own).
#
# Every claimer also holds the instance row FOR SHARE: a writer of the row (a change of
# the maximum, of the order, a stop, a probe, a block) waits for the claims under way,
# and claimers wait for it (or, settling, skip it), so the lanes never change while
# anyone claims by them. A lease claimed in lane k of an earlier split counts, under
# the split of now, in lane k % L: each live lease counts in exactly one lane. Sharers
# do not wait for each other; only a claimer's own lane is a turn.

_LANES = (f"CASE WHEN plugin_instances.ordered THEN 1 ELSE greatest(1, least({LANES_MAX}, "
          f"plugin_instances.max_concurrent_deliveries / {LANE_SIZE})) END")
# The lane to take: the one ``:preferred`` first (where the claimer's settled batch just
# freed room), then the least busy; none without room left. Locks are tried in that
# order, stopping at the first taken (the volatile filter stays above the ordered
# subquery: it is not pushed into it).
_FREE_LANE = f"""(SELECT f.k FROM (
    SELECT g.k FROM generate_series(0, {_LANES} - 1) AS g(k)
      LEFT JOIN (SELECT mod(coalesce(x.lane, 0), {_LANES}) AS k, count(*) AS busy
                   FROM deliveries x
                  WHERE x.target = plugin_instances.name AND x.state = 'in_progress'
                  GROUP BY 1) AS b ON b.k = g.k
     WHERE coalesce(b.busy, 0) < plugin_instances.max_concurrent_deliveries / {_LANES}
           + CASE WHEN g.k < mod(plugin_instances.max_concurrent_deliveries, {_LANES})
                  THEN 1 ELSE 0 END
     ORDER BY g.k = :preferred DESC, coalesce(b.busy, 0), g.k
     OFFSET 0) AS f
  WHERE pg_try_advisory_xact_lock(plugin_instances.id, f.k)
  LIMIT 1)"""
_SHARE_TARGET = f"""
SELECT {", ".join(f"plugin_instances.{c.name}" for c in _INSTANCE.c)},
       {_LANES} AS lanes, {_FREE_LANE} AS lane
  FROM plugin_instances WHERE plugin_instances.name = :name
   FOR SHARE OF plugin_instances{{skip}}"""


def _share_target(skip: bool) -> DriverSQL:
    """Run by the driver, its row read by column name like the model (psycopg loads the
    instance's JSON, times and booleans as SQLAlchemy's own types do on it)."""
    return DriverSQL(_SHARE_TARGET.format(skip=" SKIP LOCKED" if skip else ""), named=True)


_PG_SHARE_TARGET = _share_target(skip=False)
_PG_TRY_SHARE_TARGET = _share_target(skip=True)
_PG_WAIT_LANE = text("SELECT pg_advisory_xact_lock(:id, :lane)")
_SQLITE_TARGET = select(_INSTANCE, literal_column("1").label("lanes"),
                        literal_column("0").label("lane")).where(
    _INSTANCE.c.name == bindparam("name"))
# Run by the driver and typed here (DriverSQL.typed_row): through Connection.execute the
# read took 80-90 us of each claim's turn to write on SQLite, 60-70 of them SQLAlchemy's
# (timed around lock_target in a drain of 20,000 deliveries, one process).
_SQLITE_TARGET_DRIVER = DriverSQL.sqlite_of(_SQLITE_TARGET)
_SQLITE_TARGET_COLUMNS = tuple(_SQLITE_TARGET.selected_columns)


@dataclass(frozen=True)
class Turn:
    """A claimer's turn at a target: its instance row and the lane it holds."""

    instance: Any  # the instance row (attribute access like the model)
    lanes: int
    lane: int

    @property
    def share(self) -> int:
        """The lane's share of the target's Max Concurrent Deliveries."""
        total = self.instance.max_concurrent_deliveries
        return total // self.lanes + (1 if self.lane < total % self.lanes else 0)

    @property
    def params(self) -> dict[str, int]:
        """The claim statements' parameters of the lane (see :data:`_LANE_CHARGE`)."""
        return {"max_concurrent": self.share, "lanes": self.lanes, "lane": self.lane,
                "total": self.instance.max_concurrent_deliveries}


def _turn(row) -> Turn | None:
    return None if row is None or row.lane is None else Turn(row, row.lanes, row.lane)


def lock_target(session: Session, target: str, owner: str = "",
                preferred: int | None = None) -> Turn | None:
    """The claimer's turn at ``target`` for this transaction (None: no such target).
    On PostgreSQL the instance row is held FOR SHARE and one lane's lock is taken: a
    free lane with room if there is one, else the claimer waits for the lane its
    ``owner`` name falls in. Pass it to :func:`claim` in the same transaction."""
    conn = connection(session)
    if not _is_postgres(session):
        row = _SQLITE_TARGET_DRIVER.typed_row(conn, {"name": target}, _SQLITE_TARGET_COLUMNS)
        return None if row is None else Turn(row, 1, 0)
    row = _PG_SHARE_TARGET.run(conn, {
        "name": target, "preferred": -1 if preferred is None else preferred}).one_or_none()
    if row is None or row.lane is not None:
        return _turn(row)
    lane = zlib.crc32(owner.encode()) % row.lanes  # every lane taken or full: wait for one
    conn.execute(_PG_WAIT_LANE, {"id": row.id, "lane": lane})
    return Turn(row, row.lanes, lane)
