"""users.language: the UI's language a user chose (empty: the browser's)

Revision ID: 0034_user_language
Revises: 0033_attribute_index
Create Date: 2026-12-06 10:00:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0034_user_language'
down_revision = '0033_attribute_index'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('users') as batch:
        batch.add_column(sa.Column('language', sa.String(length=16), nullable=True))


def downgrade():
    with op.batch_alter_table('users') as batch:
        batch.drop_column('language')
