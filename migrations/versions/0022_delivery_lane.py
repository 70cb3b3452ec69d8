"""deliveries.lane: the lane of its target's Max Concurrent Deliveries a claim counted in

On PostgreSQL a target's Max Concurrent Deliveries is split into lanes of about 16
(b2bhub.engine.machine): claimers of one target take different lanes at once, each
counting only its own lane's live leases, where before they took turns on the target's
row. NULL (every row claimed before this revision) counts as lane 0.

Revision ID: 0022_delivery_lane
Revises: 0021_history_no_fk
Create Date: 2026-12-04 22:10:00.000000

"""
import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision = '0022_delivery_lane'
down_revision = '0021_history_no_fk'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lane', sa.SmallInteger(), nullable=True))


def downgrade():
    with op.batch_alter_table('deliveries', schema=None) as batch_op:
        batch_op.drop_column('lane')
