"""message_attributes: a message's attributes indexed by its id and name, in place of
its id alone (the duplicate check reads each candidate's sender by both)

Revision ID: 0033_attribute_index
Revises: 0032_ack_numbers
Create Date: 2026-12-06 07:40:00.000000

"""
from alembic import op

# revision identifiers, used by Alembic.
revision = '0033_attribute_index'
down_revision = '0032_ack_numbers'
branch_labels = None
depends_on = None


def upgrade():
    op.create_index('ix_message_attributes_message_name', 'message_attributes',
                    ['message_id', 'name'])
    op.drop_index('ix_message_attributes_message_id', table_name='message_attributes')


def downgrade():
    op.create_index('ix_message_attributes_message_id', 'message_attributes',
                    ['message_id'])
    op.drop_index('ix_message_attributes_message_name', table_name='message_attributes')
