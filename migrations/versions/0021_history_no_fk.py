"""history: message_id without a foreign key to messages

A settled batch writes 64 history lines; on PostgreSQL each line's foreign key was a
check, then planned at every execution (as the hub's connections planned every
statement until b2bhub.config.database's replanning), a fifth of a drain's time. Lines are written only by
the engine beside their message's rows, and the cleanup deletes them with their
message by a statement of its own (b2bhub.engine.cleanup). The index stays: every read
of a message's history goes by it.

Revision ID: 0021_history_no_fk
Revises: 0020_ui
Create Date: 2026-12-04 19:20:00.000000

"""
from alembic import op


# revision identifiers, used by Alembic.
revision = '0021_history_no_fk'
down_revision = '0020_ui'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('history', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_history_message_id_messages'),
                                 type_='foreignkey')


def downgrade():
    # lines whose message is gone (none are written so; a line racing a cleanup could
    # be) would refuse the key
    op.execute("DELETE FROM history WHERE message_id IS NOT NULL AND message_id NOT IN "
               "(SELECT id FROM messages)")
    with op.batch_alter_table('history', schema=None) as batch_op:
        batch_op.create_foreign_key(batch_op.f('fk_history_message_id_messages'),
                                    'messages', ['message_id'], ['id'], ondelete='CASCADE')
