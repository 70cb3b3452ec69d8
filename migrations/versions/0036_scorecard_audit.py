"""scorecard_days: a partner's figures per day, direction, source and target

Revision ID: 0036_scorecard_audit
Revises: 0035_expected_rules
Create Date: 2026-12-06 13:15:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0036_scorecard_audit'
down_revision = '0035_expected_rules'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'scorecard_days',
        sa.Column('partner', sa.String(length=64), nullable=False),
        sa.Column('day', sa.DateTime(), nullable=False),
        sa.Column('direction', sa.String(length=16), nullable=False),
        sa.Column('source', sa.String(length=64), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('figures', sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint('partner', 'day', 'direction', 'source', 'target',
                                name=op.f('pk_scorecard_days')),
    )


def downgrade():
    op.drop_table('scorecard_days')
