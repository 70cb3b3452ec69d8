"""poller pickups; lock names long enough for scan:<instance>

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:00:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table('poller_pickups',
    sa.Column('id', BigId, nullable=False),
    sa.Column('instance', sa.String(length=64), nullable=False),
    sa.Column('path', sa.String(length=1024), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('mtime_ns', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('message_id', BigId, nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_poller_pickups')),
    sa.UniqueConstraint('instance', 'path', 'size', 'mtime_ns', 'sha256',
                        name='uq_poller_pickups_file')
    )
    # a lease is named scan:<instance>, and an instance name has up to 64 characters
    with op.batch_alter_table('locks', schema=None) as batch_op:
        batch_op.alter_column('name', existing_type=sa.String(length=64),
                              type_=sa.String(length=100), existing_nullable=False)


def downgrade():
    with op.batch_alter_table('locks', schema=None) as batch_op:
        batch_op.alter_column('name', existing_type=sa.String(length=100),
                              type_=sa.String(length=64), existing_nullable=False)
    op.drop_table('poller_pickups')
