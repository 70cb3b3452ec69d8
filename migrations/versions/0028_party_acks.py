"""parties.functional_acks, parties.ack_hours: the EDI acknowledgments a partner gets
and gives

Revision ID: 0028_party_acks
Revises: 0027_parties_from
Create Date: 2026-12-06 06:50:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0028_party_acks'
down_revision = '0027_parties_from'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('parties', schema=None) as batch_op:
        batch_op.add_column(sa.Column('functional_acks', sa.String(length=8),
                                      server_default='none', nullable=False))
        batch_op.add_column(sa.Column('ack_hours', sa.Integer(), nullable=True))


def downgrade():
    with op.batch_alter_table('parties', schema=None) as batch_op:
        batch_op.drop_column('ack_hours')
        batch_op.drop_column('functional_acks')
