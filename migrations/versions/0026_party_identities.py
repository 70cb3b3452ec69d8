"""party_identities: a party's EDI identities (qualifier:id), each one party's at most

Revision ID: 0026_party_identities
Revises: 0025_route_document_type
Create Date: 2026-12-06 04:10:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0026_party_identities'
down_revision = '0025_route_document_type'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'party_identities',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('party_id', sa.Integer(), nullable=False),
        sa.Column('qualifier', sa.String(length=4), nullable=False),
        sa.Column('identifier', sa.String(length=35), nullable=False),
        sa.ForeignKeyConstraint(['party_id'], ['parties.id'],
                                name=op.f('fk_party_identities_party_id_parties'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_party_identities')),
        sa.UniqueConstraint('qualifier', 'identifier',
                            name=op.f('uq_party_identities_qualifier')),
    )
    op.create_index(op.f('ix_party_identities_party_id'), 'party_identities', ['party_id'])


def downgrade():
    op.drop_table('party_identities')
