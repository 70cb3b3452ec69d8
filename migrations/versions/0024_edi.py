"""message attributes: what a document inspector read of a message's envelope

Revision ID: 0024_edi
Revises: 0023_partial_indexes
Create Date: 2026-12-05 20:40:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0024_edi'
down_revision = '0023_partial_indexes'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'message_attributes',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                  primary_key=True),
        sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                  sa.ForeignKey('messages.id', ondelete='CASCADE'), nullable=False),
        sa.Column('name', sa.String(32), nullable=False),
        sa.Column('value', sa.String(255), nullable=False),
    )
    op.create_index('ix_message_attributes_message_id', 'message_attributes',
                    ['message_id'])
    op.create_index('ix_message_attributes_name_value', 'message_attributes',
                    ['name', 'value'])


def downgrade():
    op.drop_table('message_attributes')
