"""plugin_instances.parties_from: a source's from and to, its own or its envelope's

Revision ID: 0027_parties_from
Revises: 0026_party_identities
Create Date: 2026-12-06 04:20:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0027_parties_from'
down_revision = '0026_party_identities'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('plugin_instances', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parties_from', sa.String(length=16),
                                      server_default='source', nullable=False))


def downgrade():
    with op.batch_alter_table('plugin_instances', schema=None) as batch_op:
        batch_op.drop_column('parties_from')
