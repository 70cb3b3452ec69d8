"""processes: since when each process has beaten without a gap

The sweep puts back the leases of a process known dead (its heartbeat stopped). It
trusts a stopped heartbeat only while another process shows the database took
heartbeats without a gap over the last interval: ``steady_since`` is the database time
from which a process's heartbeats have come on time. After an outage of the database
no process is steady, so nobody is declared dead for what was the database's fault.

Revision ID: 0010_recovery
Revises: 0009_probes
Create Date: 2026-12-01 19:00:00.000000

"""
import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision = '0010_recovery'
down_revision = '0009_probes'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('steady_since', sa.DateTime(), nullable=True))


def downgrade():
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.drop_column('steady_since')
