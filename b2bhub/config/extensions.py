"""Extensions, created unbound; ``create_app`` binds them. No module keeps the app."""

from flask_babel import Babel
from flask_login import LoginManager
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from flask_wtf import CSRFProtect

from b2bhub.models.base import Base

# The models are plain SQLAlchemy (the engine uses them without Flask); Flask-SQLAlchemy
# manages sessions and engines over the same metadata, and Flask-Migrate reads it.
db = SQLAlchemy(metadata=Base.metadata)
migrate = Migrate(render_as_batch=True, compare_type=True)
csrf = CSRFProtect()
login_manager = LoginManager()
babel = Babel()
