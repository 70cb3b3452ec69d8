"""b2bhub_locked_statuses(ids): PostgreSQL locks the messages and reads their deliveries'
states in one call (b2bhub.engine.status)

Revision ID: 0037_locked_statuses
Revises: 0036_scorecard_audit
Create Date: 2026-12-07 11:00:00.000000

"""
from alembic import op

# revision identifiers, used by Alembic.
revision = '0037_locked_statuses'
down_revision = '0036_scorecard_audit'
branch_labels = None
depends_on = None

# Two statements, one round trip: a VOLATILE function takes a fresh snapshot for each
# statement it runs, so the states are read after the locks were granted, exactly as
# the two statements sent one after the other read them. The text lives here, as it
# was at this revision; b2bhub.engine.status calls it.
_FUNCTION = """
CREATE OR REPLACE FUNCTION b2bhub_locked_statuses(ids bigint[])
RETURNS TABLE(message_id bigint, message_status varchar, delivery_state varchar,
              delivery_failure_kind varchar)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM 1 FROM messages m WHERE m.id = ANY(ids) ORDER BY m.id FOR UPDATE;
  RETURN QUERY
    SELECT m.id, m.status, d.state, d.failure_kind
      FROM unnest(ids) AS k(id)
      JOIN messages m ON m.id = k.id
      LEFT JOIN LATERAL (SELECT x.state, x.failure_kind FROM deliveries x
                          WHERE x.message_id = k.id OFFSET 0) AS d ON true;
END
$$"""


def upgrade():
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(_FUNCTION)


def downgrade():
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("DROP FUNCTION IF EXISTS b2bhub_locked_statuses(bigint[])")
