"""partial indexes: a row whose indexed time is NULL is in none of them; one unused index gone

Every write of a delivery's state (a claim, a settlement) is a new row version that
every index of the table takes an entry for, whether or not the indexed columns
changed (``state`` is in most of them). Three of the deliveries' indexes serve only
rows whose second column is set, and the rows that matter most in number have it
NULL: the wake-up time (NULL from a delivery's first claim on), the lease (set only
while in progress) and the receipt deadline (only awaiting a receipt). Each now holds
only the rows with the column set; every query that reads it compares the column
(``<``, ``<=``), which implies it is not NULL, so both databases still use it. Likewise
the messages' correlation id (compared with ``=``), NULL where no source gave one. The
receipt reference's index goes: no query looks a delivery up by it (a receipt names
its delivery by id and the reference is checked on that row). A delivery claimed and
delivered adds nine fewer index entries (three at the claim, four at the settlement, one
at each of its message's two status writes), and the sweep's indexes hold the rows it
looks for instead of every delivery ever made.

Revision ID: 0023_partial_indexes
Revises: 0022_delivery_lane
Create Date: 2026-12-05 01:10:00.000000

"""
import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision = '0023_partial_indexes'
down_revision = '0022_delivery_lane'
branch_labels = None
depends_on = None

#: (table, index, columns, the column that must be set)
PARTIAL = [
    ('deliveries', 'ix_deliveries_state_wake', ['state', 'next_wake_at'], 'next_wake_at'),
    ('deliveries', 'ix_deliveries_state_lease', ['state', 'lease_until'], 'lease_until'),
    ('deliveries', 'ix_deliveries_state_receipt', ['state', 'receipt_deadline'],
     'receipt_deadline'),
    ('messages', 'ix_messages_correlation_id', ['correlation_id'], 'correlation_id'),
]


def upgrade():
    op.drop_index('ix_deliveries_receipt_ref', table_name='deliveries')
    for table, name, columns, column in PARTIAL:
        where = sa.text(f"{column} IS NOT NULL")
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns, unique=False, postgresql_where=where,
                        sqlite_where=where)


def downgrade():
    for table, name, columns, _column in PARTIAL:
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns, unique=False)
    op.create_index('ix_deliveries_receipt_ref', 'deliveries', ['receipt_ref'], unique=False)
