"""http_receiver_idempotency.message_id indexed

The column refers to messages with ON DELETE SET NULL: every message the nightly
cleanup deletes makes PostgreSQL look for the keys that name it, which without an
index is a scan of the whole table per deleted message.

Revision ID: 0019_idem_message_index
Revises: 0018_correlation
Create Date: 2026-12-02 02:00:00.000000

"""
from alembic import op

# revision identifiers, used by Alembic.
revision = '0019_idem_message_index'
down_revision = '0018_correlation'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('http_receiver_idempotency') as batch_op:
        batch_op.create_index('ix_http_receiver_idempotency_message_id', ['message_id'])


def downgrade():
    with op.batch_alter_table('http_receiver_idempotency') as batch_op:
        batch_op.drop_index('ix_http_receiver_idempotency_message_id')
