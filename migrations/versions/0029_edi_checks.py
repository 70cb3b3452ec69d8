"""plugin_instances.edi_errors, duplicates, duplicate_days: a source's checks of the
envelopes it receives (envelope errors accepted or refused; duplicate interchanges
alerted or refused, within so many days)

Revision ID: 0029_edi_checks
Revises: 0028_party_acks
Create Date: 2026-12-06 07:00:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0029_edi_checks'
down_revision = '0028_party_acks'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('plugin_instances', schema=None) as batch_op:
        batch_op.add_column(sa.Column('edi_errors', sa.String(length=16),
                                      server_default='accept', nullable=False))
        batch_op.add_column(sa.Column('duplicates', sa.String(length=16),
                                      server_default='alert', nullable=False))
        batch_op.add_column(sa.Column('duplicate_days', sa.Integer(),
                                      server_default='30', nullable=False))


def downgrade():
    with op.batch_alter_table('plugin_instances', schema=None) as batch_op:
        batch_op.drop_column('duplicate_days')
        batch_op.drop_column('duplicates')
        batch_op.drop_column('edi_errors')
