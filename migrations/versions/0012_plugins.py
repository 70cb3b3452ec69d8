"""Protocols as plugins: the profiles version setting loses its protocol's name.

The per-process profile caches are valid while the ``profiles_version`` setting is the
one they were read under; the row kept its old name until now, so it is renamed rather
than started anew (a new row would leave the caches off until the first profile save).
The protocol's own tables stay as migration 0006 made them: a plugin's later changes to
them are migrations of its own package.

Revision ID: 0012_plugins
Revises: 0011_retention
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_plugins"
down_revision = "0011_retention"
branch_labels = None
depends_on = None

_OLD, _NEW = "as2_profiles_version", "profiles_version"
_settings = sa.table("settings", sa.column("key", sa.String))


def upgrade():
    op.execute(_settings.update().where(_settings.c.key == _OLD).values(key=_NEW))


def downgrade():
    op.execute(_settings.update().where(_settings.c.key == _NEW).values(key=_OLD))
