"""edi_ack_waits, edi_acks_received: acknowledgments expected for interchanges we send,
and those received until matched

Revision ID: 0031_ack_waits
Revises: 0029_edi_checks
Create Date: 2026-12-06 12:00:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0031_ack_waits'
down_revision = '0029_edi_checks'
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
DUE = sa.text("due_at IS NOT NULL")


def upgrade():
    op.create_table(
        'edi_ack_waits',
        sa.Column('id', ID, primary_key=True),
        sa.Column('message_id', ID, sa.ForeignKey('messages.id', ondelete='CASCADE'),
                  nullable=False),
        sa.Column('partner', sa.String(64), nullable=False),
        sa.Column('standard', sa.String(16), nullable=False),
        sa.Column('our_identity', sa.String(64), nullable=False),
        sa.Column('partner_identity', sa.String(64), nullable=False),
        sa.Column('interchange_control', sa.String(35), nullable=False),
        sa.Column('control', sa.String(35), nullable=False),
        sa.Column('functional_id', sa.String(8), nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('due_at', sa.DateTime(), nullable=True),
        sa.Column('overdue', sa.Boolean(), nullable=False),
        sa.Column('ack_message_id', sa.BigInteger(), nullable=True),
        sa.Column('result', sa.String(32), nullable=False),
        sa.Column('codes', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('settled_at', sa.DateTime(), nullable=True),
    )
    op.create_index('ix_edi_ack_waits_message_id', 'edi_ack_waits', ['message_id'])
    op.create_index('ix_edi_ack_waits_key', 'edi_ack_waits',
                    ['partner_identity', 'control'])
    op.create_index('ix_edi_ack_waits_due', 'edi_ack_waits', ['due_at'],
                    postgresql_where=DUE, sqlite_where=DUE)
    op.create_table(
        'edi_acks_received',
        sa.Column('id', ID, primary_key=True),
        sa.Column('message_id', ID, sa.ForeignKey('messages.id', ondelete='CASCADE'),
                  nullable=False),
        sa.Column('standard', sa.String(16), nullable=False),
        sa.Column('sender', sa.String(64), nullable=False),
        sa.Column('receiver', sa.String(64), nullable=False),
        sa.Column('acknowledges', sa.JSON(), nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('due_at', sa.DateTime(), nullable=True),
        sa.Column('created_at', sa.DateTime(), nullable=False),
    )
    op.create_index('ix_edi_acks_received_message_id', 'edi_acks_received',
                    ['message_id'])
    op.create_index('ix_edi_acks_received_due', 'edi_acks_received', ['due_at'],
                    postgresql_where=DUE, sqlite_where=DUE)


def downgrade():
    op.drop_table('edi_acks_received')
    op.drop_table('edi_ack_waits')
