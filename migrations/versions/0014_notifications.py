"""alert notifications: channels (Apprise URLs) and one row per notification to send

Alerts that exist already count as notified, so an upgrade sends no flood of old ones.

Revision ID: 0014_notifications
Revises: 0012_plugins
Create Date: 2026-12-01 18:45:00.000000

"""
import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision = '0014_notifications'
down_revision = '0012_plugins'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade():
    op.create_table(
        'notification_channels',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('url', sa.String(), nullable=False),
        sa.Column('kinds', sa.JSON(), nullable=False),
        sa.Column('on_resolve', sa.Boolean(), nullable=False),
        sa.Column('enabled', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('created_by', sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_notification_channels')),
        sa.UniqueConstraint('name', name=op.f('uq_notification_channels_name')))
    op.create_table(
        'notifications',
        sa.Column('id', BigId, nullable=False),
        sa.Column('channel_id', sa.Integer(), nullable=False),
        sa.Column('event', sa.String(length=16), nullable=False),
        sa.Column('alert_ids', sa.JSON(), nullable=False),
        sa.Column('title', sa.String(), nullable=False),
        sa.Column('body', sa.String(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('due_at', sa.DateTime(), nullable=False),
        sa.Column('lease_until', sa.DateTime(), nullable=True),
        sa.Column('sent_at', sa.DateTime(), nullable=True),
        sa.Column('last_error', sa.String(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(['channel_id'], ['notification_channels.id'],
                                name=op.f('fk_notifications_channel_id_notification_channels'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_notifications')))
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.create_index('ix_notifications_state_due', ['state', 'due_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_notifications_channel_id'), ['channel_id'],
                              unique=False)
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('notified_at', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('resolve_notified_at', sa.DateTime(), nullable=True))
    op.execute("UPDATE alerts SET notified_at = created_at, "
               "resolve_notified_at = resolved_at")


def downgrade():
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_column('resolve_notified_at')
        batch_op.drop_column('notified_at')
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_notifications_channel_id'))
        batch_op.drop_index('ix_notifications_state_due')
    op.drop_table('notifications')
    op.drop_table('notification_channels')
