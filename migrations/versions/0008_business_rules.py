"""plugin_instances: business-error rules, and the delivery that blocks the instance

``business_rules`` holds a target instance's rules (a JSON list, null for none);
``blocked_by_delivery_id`` names the failed delivery whose rule with ``block:
"instance"`` holds back every further delivery of the instance until an operator
resubmits or skips it (null: not blocked). No foreign key: the blocking delivery is
failed, and a blocked instance is released by the operator, not by a cascade.

Revision ID: 0008_business_rules
Revises: 0007_deliveries_claimable
Create Date: 2026-12-01 19:00:00.000000

"""
import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision = '0008_business_rules'
down_revision = '0007_deliveries_claimable'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('plugin_instances', schema=None) as batch_op:
        batch_op.add_column(sa.Column('business_rules', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('blocked_by_delivery_id', sa.BigInteger(),
                                      nullable=True))


def downgrade():
    with op.batch_alter_table('plugin_instances', schema=None) as batch_op:
        batch_op.drop_column('blocked_by_delivery_id')
        batch_op.drop_column('business_rules')
