"""edi_ack_jobs, edi_ack_numbers: the functional acknowledgments still to be made, and
our control numbers for them per partner and standard

Revision ID: 0032_ack_numbers
Revises: 0031_ack_waits
Create Date: 2026-12-06 09:00:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0032_ack_numbers'
down_revision = '0031_ack_waits'
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table(
        'edi_ack_jobs',
        sa.Column('message_id', BIG_ID, nullable=False),
        sa.Column('due_at', sa.DateTime(), nullable=True),
        sa.Column('claimed_by', sa.String(length=80), nullable=True),
        sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
        sa.Column('last_error', sa.String(length=500), server_default='', nullable=False),
        sa.ForeignKeyConstraint(['message_id'], ['messages.id'],
                                name=op.f('fk_edi_ack_jobs_message_id_messages'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('message_id', name=op.f('pk_edi_ack_jobs')),
    )
    op.create_index(op.f('ix_edi_ack_jobs_due_at'), 'edi_ack_jobs', ['due_at'])
    op.create_table(
        'edi_ack_numbers',
        sa.Column('party_id', sa.Integer(), nullable=False),
        sa.Column('standard', sa.String(length=16), nullable=False),
        sa.Column('last_number', sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(['party_id'], ['parties.id'],
                                name=op.f('fk_edi_ack_numbers_party_id_parties'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('party_id', 'standard', name=op.f('pk_edi_ack_numbers')),
    )


def downgrade():
    op.drop_table('edi_ack_numbers')
    op.drop_index(op.f('ix_edi_ack_jobs_due_at'), table_name='edi_ack_jobs')
    op.drop_table('edi_ack_jobs')
