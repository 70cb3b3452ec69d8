"""routes.document_type: a route may require a document type of the message's envelope

Revision ID: 0025_route_document_type
Revises: 0024_edi
Create Date: 2026-12-06 04:00:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0025_route_document_type'
down_revision = '0024_edi'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('routes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('document_type', sa.String(length=35),
                                      server_default='*', nullable=False))


def downgrade():
    with op.batch_alter_table('routes', schema=None) as batch_op:
        batch_op.drop_column('document_type')
