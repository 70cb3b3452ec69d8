"""messages: index (from_party, id) and (to_party, id) instead of (from_party), (to_party)

A partner's page reads the partner's newest messages, each way, and those of the last
day (an id range found from (created_at, id)); with the single-column indexes each read
took every message the partner ever sent or received and sorted them. The messages
list's From and To filters, newest first, gain the same way.

Revision ID: 0020_ui
Revises: 0019_idem_message_index
Create Date: 2027-01-20 10:00:00.000000

"""
from alembic import op


# revision identifiers, used by Alembic.
revision = '0020_ui'
down_revision = '0019_idem_message_index'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('ix_messages_from_party_id', ['from_party', 'id'], unique=False)
        batch_op.create_index('ix_messages_to_party_id', ['to_party', 'id'], unique=False)
        batch_op.drop_index('ix_messages_from_party')
        batch_op.drop_index('ix_messages_to_party')


def downgrade():
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('ix_messages_from_party', ['from_party'], unique=False)
        batch_op.create_index('ix_messages_to_party', ['to_party'], unique=False)
        batch_op.drop_index('ix_messages_from_party_id')
        batch_op.drop_index('ix_messages_to_party_id')
