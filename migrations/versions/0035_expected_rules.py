"""expected_rules and expected_windows: expected-message rules and their windows

Revision ID: 0035_expected_rules
Revises: 0034_user_language
Create Date: 2026-12-06 13:30:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0035_expected_rules'
down_revision = '0034_user_language'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'expected_rules',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('description', sa.String(length=255), nullable=False),
        sa.Column('direction', sa.String(length=16), nullable=False),
        sa.Column('from_party', sa.String(length=64), nullable=False),
        sa.Column('to_party', sa.String(length=64), nullable=False),
        sa.Column('source', sa.String(length=64), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('filename', sa.String(length=255), nullable=False),
        sa.Column('document_type', sa.String(length=35), nullable=False),
        sa.Column('schedule', sa.String(length=100), nullable=True),
        sa.Column('timezone', sa.String(length=64), nullable=False),
        sa.Column('opens_minutes', sa.Integer(), nullable=True),
        sa.Column('after', sa.JSON(), nullable=True),
        sa.Column('within_minutes', sa.Integer(), nullable=True),
        sa.Column('enabled', sa.Boolean(), nullable=False),
        sa.Column('planned_until', sa.DateTime(), nullable=True),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('created_by', sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_expected_rules')),
        sa.UniqueConstraint('name', name=op.f('uq_expected_rules_name')))
    op.create_table(
        'expected_windows',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('rule_id', sa.Integer(), nullable=False),
        sa.Column('key', sa.String(length=40), nullable=False),
        sa.Column('starts_at', sa.DateTime(), nullable=False),
        sa.Column('ends_at', sa.DateTime(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('trigger_message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                  nullable=True),
        sa.Column('from_party', sa.String(length=64), nullable=False),
        sa.Column('to_party', sa.String(length=64), nullable=False),
        sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                  nullable=True),
        sa.Column('arrived_at', sa.DateTime(), nullable=True),
        sa.Column('judged_at', sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(['rule_id'], ['expected_rules.id'],
                                name=op.f('fk_expected_windows_rule_id_expected_rules'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_expected_windows')),
        sa.UniqueConstraint('rule_id', 'key', name=op.f('uq_expected_windows_rule_id')))
    op.create_index('ix_expected_windows_state_ends', 'expected_windows',
                    ['state', 'ends_at'])
    op.create_index('ix_expected_windows_rule_ends', 'expected_windows',
                    ['rule_id', 'ends_at'])


def downgrade():
    op.drop_table('expected_windows')
    op.drop_table('expected_rules')
