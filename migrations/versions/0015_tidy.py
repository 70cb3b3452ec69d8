"""deliveries.sequence_no goes: no query ever read it (an ordered sequence goes by id)

The index on (target, sequence_key, sequence_no) becomes one on (target, sequence_key,
id), the columns the sequence checks do use. SQLite 3.35+ drops a column in place.

Revision ID: 0015_tidy
Revises: 0014_notifications
Create Date: 2026-12-01 23:20:00.000000

"""
import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision = '0015_tidy'
down_revision = '0014_notifications'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade():
    op.drop_index('ix_deliveries_sequence', table_name='deliveries')
    op.execute("ALTER TABLE deliveries DROP COLUMN sequence_no")
    op.create_index('ix_deliveries_sequence', 'deliveries',
                    ['target', 'sequence_key', 'id'], unique=False)


def downgrade():
    op.drop_index('ix_deliveries_sequence', table_name='deliveries')
    op.add_column('deliveries', sa.Column('sequence_no', BigId, nullable=True))
    op.execute("UPDATE deliveries SET sequence_no = id")
    op.create_index('ix_deliveries_sequence', 'deliveries',
                    ['target', 'sequence_key', 'sequence_no'], unique=False)
