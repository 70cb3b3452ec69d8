"""http_receiver: per-instance bearer tokens (hashed) and remembered Idempotency-Keys

Revision ID: 0016_http_receiver
Revises: 0015_tidy
Create Date: 2026-12-01 23:10:00.000000

"""
import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision = '0016_http_receiver'
down_revision = '0015_tidy'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade():
    op.create_table(
        'http_receiver_tokens',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('instance', sa.String(length=64), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('token_sha256', sa.String(length=64), nullable=False),
        sa.Column('created_by', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('instance', 'name', name='uq_http_receiver_token'),
        sa.UniqueConstraint('token_sha256'),
    )
    op.create_index('ix_http_receiver_tokens_instance', 'http_receiver_tokens', ['instance'])
    op.create_table(
        'http_receiver_idempotency',
        sa.Column('id', BigId, nullable=False),
        sa.Column('instance', sa.String(length=64), nullable=False),
        sa.Column('key', sa.String(length=255), nullable=False),
        sa.Column('body_sha256', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('message_id', BigId, sa.ForeignKey('messages.id', ondelete='SET NULL'),
                  nullable=True),
        sa.Column('status', sa.Integer(), nullable=True),
        sa.Column('headers', sa.String(), nullable=False),
        sa.Column('body', sa.LargeBinary(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('expires_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('instance', 'key', name='uq_http_receiver_idem'),
    )
    op.create_index('ix_http_receiver_idempotency_expires_at', 'http_receiver_idempotency',
                    ['expires_at'])


def downgrade():
    op.drop_table('http_receiver_idempotency')
    op.drop_table('http_receiver_tokens')
