"""How the hub is configured and bound together.

``environment`` reads the ``B2BHUB_*`` variables (each listed with its default and
meaning); ``database`` is what every database connection gets (SQLite pragmas, the
PostgreSQL plan discard); ``extensions`` holds the Flask extensions, created unbound and
bound by :func:`b2bhub.create_app`.
"""
