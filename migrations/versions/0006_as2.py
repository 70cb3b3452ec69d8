"""AS2: received messages with the receipts owed, sent messages with their MIC

Revision ID: 0006_as2
Revises: 0005_messages_created_at_id
Create Date: 2026-12-01 04:00:00.000000

AS2 profiles themselves use the protocol_profiles and certificates tables of 0001.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0006_as2'
down_revision = '0005_messages_created_at_id'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table('as2_inbound',
    sa.Column('id', BigId, nullable=False),
    sa.Column('instance', sa.String(length=64), nullable=False),
    sa.Column('partner', sa.String(length=64), nullable=False),
    sa.Column('as2_message_id', sa.String(length=255), nullable=False),
    sa.Column('accepted_key', sa.String(length=330), nullable=True),
    sa.Column('message_id', BigId, nullable=True),
    sa.Column('mdn_digest', sa.String(length=64), nullable=True),
    sa.Column('mdn_headers', sa.JSON(), nullable=True),
    sa.Column('mdn_url', sa.Text(), nullable=True),
    sa.Column('mdn_state', sa.String(length=16), nullable=False),
    sa.Column('mdn_due_at', sa.DateTime(), nullable=True),
    sa.Column('mdn_attempts', sa.Integer(), nullable=False),
    sa.Column('mdn_last_error', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['message_id'], ['messages.id'], name=op.f('fk_as2_inbound_message_id_messages'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_as2_inbound')),
    sa.UniqueConstraint('accepted_key', name=op.f('uq_as2_inbound_accepted_key'))
    )
    with op.batch_alter_table('as2_inbound', schema=None) as batch_op:
        batch_op.create_index('ix_as2_inbound_mdn_due', ['mdn_state', 'mdn_due_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_as2_inbound_message_id'), ['message_id'], unique=False)

    op.create_table('as2_outbound',
    sa.Column('id', BigId, nullable=False),
    sa.Column('message_id', BigId, nullable=False),
    sa.Column('target', sa.String(length=64), nullable=False),
    sa.Column('as2_message_id', sa.String(length=255), nullable=False),
    sa.Column('partner', sa.String(length=64), nullable=False),
    sa.Column('mic', sa.String(length=200), nullable=True),
    sa.Column('digest_alg', sa.String(length=16), nullable=True),
    sa.Column('mdn_signed', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['message_id'], ['messages.id'], name=op.f('fk_as2_outbound_message_id_messages'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_as2_outbound')),
    sa.UniqueConstraint('as2_message_id', name=op.f('uq_as2_outbound_as2_message_id')),
    sa.UniqueConstraint('message_id', 'target', name=op.f('uq_as2_outbound_message_id'))
    )


def downgrade():
    op.drop_table('as2_outbound')
    with op.batch_alter_table('as2_inbound', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_as2_inbound_message_id'))
        batch_op.drop_index('ix_as2_inbound_mdn_due')
    op.drop_table('as2_inbound')
