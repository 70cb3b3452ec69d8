"""cleanup_runs: each run of the nightly cleanup (SPEC 13)

Revision ID: 0011_retention
Revises: 0010_recovery
Create Date: 2026-12-01 19:00:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0011_retention'
down_revision = '0010_recovery'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table(
        'cleanup_runs',
        sa.Column('id', BigId, nullable=False),
        sa.Column('started_at', sa.DateTime(), nullable=False),
        sa.Column('finished_at', sa.DateTime(), nullable=True),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('trigger', sa.String(length=16), nullable=False),
        sa.Column('owner', sa.String(length=128), nullable=False),
        sa.Column('messages_removed', BigId, nullable=False),
        sa.Column('bytes_removed', BigId, nullable=False),
        sa.Column('files_removed', BigId, nullable=False),
        sa.Column('error', sa.Text(), nullable=False),
        sa.Column('store_files', BigId, nullable=True),
        sa.Column('store_bytes', BigId, nullable=True),
        sa.Column('referenced_files', BigId, nullable=True),
        sa.Column('referenced_bytes', BigId, nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_cleanup_runs')),
    )
    with op.batch_alter_table('cleanup_runs', schema=None) as batch_op:
        batch_op.create_index('ix_cleanup_runs_started_at', ['started_at'], unique=False)


def downgrade():
    with op.batch_alter_table('cleanup_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_cleanup_runs_started_at')
    op.drop_table('cleanup_runs')
