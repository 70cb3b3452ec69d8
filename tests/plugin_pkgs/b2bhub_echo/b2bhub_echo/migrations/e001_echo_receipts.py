"""echo: the echo_receipts table (a branch of the echo plugin's own)

Revision ID: e001_echo_receipts
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "e001_echo_receipts"
down_revision = None
branch_labels = ("echo",)
depends_on = "0001"  # the core revision that made the messages table it refers to


def upgrade():
    op.create_table(
        "echo_receipts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  primary_key=True, autoincrement=True),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("message_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("messages.id", ondelete="CASCADE"), nullable=False),
        sa.Column("echo_id", sa.String(100), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("tallied_at", sa.DateTime(), nullable=True),
    )


def downgrade():
    op.drop_table("echo_receipts")
