"""correlation and tracing: messages.correlation_id indexed, messages.trace_parent

``correlation_id`` (there since the first schema) is now filled by every source and
filtered on; ``trace_parent`` keeps the W3C traceparent of the span that stored the
message, so the worker's delivery attempts join its trace.

Revision ID: 0018_correlation
Revises: 0016_http_receiver
Create Date: 2026-12-01 23:10:00.000000

"""
import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0018_correlation'
down_revision = '0016_http_receiver'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('messages') as batch_op:
        batch_op.add_column(sa.Column('trace_parent', sa.String(length=55), nullable=True))
        batch_op.create_index('ix_messages_correlation_id', ['correlation_id'])


def downgrade():
    with op.batch_alter_table('messages') as batch_op:
        batch_op.drop_index('ix_messages_correlation_id')
        batch_op.drop_column('trace_parent')
