"""messages: index (created_at, id) instead of (created_at)

A time window of the message list finds the window's lowest and highest id from this
index alone (an index-only scan), then reads the newest rows of that id range by the
primary key; with (created_at) alone it read every row of the window and sorted them.

Revision ID: 0005_messages_created_at_id
Revises: 0004_live_logs_stats
Create Date: 2026-12-01 03:40:00.000000

"""
from alembic import op


# revision identifiers, used by Alembic.
revision = '0005_messages_created_at_id'
down_revision = '0004_live_logs_stats'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('ix_messages_created_at_id', ['created_at', 'id'], unique=False)
        batch_op.drop_index('ix_messages_created_at')


def downgrade():
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('ix_messages_created_at', ['created_at'], unique=False)
        batch_op.drop_index('ix_messages_created_at_id')
