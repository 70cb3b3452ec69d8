"""The schema the migrations make is the one the models describe: a column, index or
foreign key added to a model without its migration (or the other way round) fails here,
before an installation upgraded in place finds out."""

from __future__ import annotations

import b2bhub_echo.models  # noqa: F401  (every model on the metadata: the test package's,
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

import plugins.as2.models  # noqa: F401  the built-in protocols')
import plugins.http_receiver  # noqa: F401
from b2bhub.models import Base


def test_the_migrations_make_the_schema_the_models_describe(db):
    with db.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": False})
        differences = compare_metadata(context, Base.metadata)
    assert differences == []
