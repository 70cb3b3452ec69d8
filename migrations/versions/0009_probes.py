"""plugin_instances: the last probe's time and text; probe_interval 0 follows the setting

A target whose type can probe (SPEC 8) records the last result in ``online`` (which
exists), when that probe began (``probe_checked_at``) and what it said (``probe_text``).
``probe_interval`` 0 now means "the System > Settings probe interval"; the old default
60 had no effect until now (nothing probed), so rows holding it follow the setting.

Revision ID: 0009_probes
Revises: 0008_business_rules
Create Date: 2026-12-01 18:40:00.000000

"""
import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision = '0009_probes'
down_revision = '0008_business_rules'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('plugin_instances', schema=None) as batch_op:
        batch_op.add_column(sa.Column('probe_checked_at', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('probe_text', sa.String(), nullable=True))
    op.execute("UPDATE plugin_instances SET probe_interval = 0 WHERE probe_interval = 60")


def downgrade():
    op.execute("UPDATE plugin_instances SET probe_interval = 60 WHERE probe_interval = 0")
    with op.batch_alter_table('plugin_instances', schema=None) as batch_op:
        batch_op.drop_column('probe_text')
        batch_op.drop_column('probe_checked_at')
