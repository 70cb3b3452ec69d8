"""log records of every process, per-minute stats for the dashboard

Revision ID: 0004_live_logs_stats
Revises: 0003
Create Date: 2026-12-01 03:20:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0004_live_logs_stats'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('log_records',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('level', sa.Integer(), nullable=False),
    sa.Column('logger', sa.String(length=200), nullable=False),
    sa.Column('message', sa.String(), nullable=False),
    sa.Column('process_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_log_records'))
    )
    with op.batch_alter_table('log_records', schema=None) as batch_op:
        batch_op.create_index('ix_log_records_level_id', ['level', 'id'], unique=False)

    op.create_table('stats_minutes',
    sa.Column('minute', sa.DateTime(), nullable=False),
    sa.Column('messages_in', sa.Integer(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('delivered', sa.Integer(), nullable=False),
    sa.Column('failures', sa.Integer(), nullable=False),
    sa.Column('duration_avg', sa.Double(), nullable=True),
    sa.Column('duration_max', sa.Double(), nullable=True),
    sa.Column('due', sa.Integer(), nullable=False),
    sa.Column('oldest_due_seconds', sa.Double(), nullable=True),
    sa.PrimaryKeyConstraint('minute', name=op.f('pk_stats_minutes'))
    )


def downgrade():
    op.drop_table('stats_minutes')
    with op.batch_alter_table('log_records', schema=None) as batch_op:
        batch_op.drop_index('ix_log_records_level_id')
    op.drop_table('log_records')
