"""users; API tokens may belong to a user

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 03:10:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('users',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('password_hash', sa.String(length=256), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('disabled_at', sa.DateTime(), nullable=True),
    sa.Column('last_login_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
    sa.UniqueConstraint('name', name=op.f('uq_users_name'))
    )
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user_id', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_api_tokens_user_id'), ['user_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_api_tokens_user_id_users'), 'users',
                                    ['user_id'], ['id'], ondelete='CASCADE')


def downgrade():
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_api_tokens_user_id_users'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_api_tokens_user_id'))
        batch_op.drop_column('user_id')
    op.drop_table('users')
