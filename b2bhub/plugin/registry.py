"""The plugin registry: plugin types found through entry points (SPEC 3).

Every plugin type, built-in or third-party, is a class named by an entry point in the
group ``b2bhub.plugins``; installing a package is all it takes to add one. A plugin that
fails to import or does not look like a plugin is logged and skipped, never fatal, so one
broken package cannot stop the hub (as stevedore's ``ExtensionManager`` does).

The registry checks classes by their attributes (``type_name``, ``roles``,
``config_schema``) rather than by subclassing, so it needs nothing from the plugin
interface module. Plain Python: no Flask, no Celery, no SQLAlchemy.
"""

from __future__ import annotations

import logging
import re
import threading
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from b2bhub.config import environment
from b2bhub.plugin.schema import Field, schema_problem

__all__ = ["GROUP", "ROLES", "PluginRegistry", "get_registry", "plugin_problem", "registry"]

GROUP = "b2bhub.plugins"
ROLES = frozenset({"source", "target"})

log = logging.getLogger("b2bhub.plugins")


def plugin_problem(cls: Any, entry_point_name: str | None = None) -> str | None:
    """What keeps ``cls`` from being a plugin type, or None if it is one."""
    if not isinstance(cls, type):
        return f"{cls!r} is not a class"
    type_name = getattr(cls, "type_name", None)
    if not isinstance(type_name, str) or not type_name:
        return f"{_qualname(cls)} has no type_name"
    if entry_point_name is not None and type_name != entry_point_name:
        return (
            f"{_qualname(cls)}.type_name is {type_name!r} but its entry point is "
            f"named {entry_point_name!r}"
        )
    roles = getattr(cls, "roles", None)
    if not isinstance(roles, set | frozenset) or not roles or not roles <= ROLES:
        return f"{_qualname(cls)}.roles must be a non-empty set of 'source' and/or 'target'"
    return schema_problem(getattr(cls, "config_schema", None)) or _hook_problem(cls)


_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_AT = re.compile(r"([01]\d|2[0-3]):[0-5]\d")


def _hook_problem(cls: type) -> str | None:
    """What is wrong with the protocol hooks a class declares (b2bhub/plugin/__init__.py)."""
    prefix = getattr(cls, "endpoint_prefix", None)
    if prefix is not None and (not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix)):
        return f"{_qualname(cls)}.endpoint_prefix must be a URL segment of a-z, 0-9, _ . -"
    for job in getattr(cls, "periodic_jobs", ()) or ():
        every, at = getattr(job, "every", None), getattr(job, "at", None)
        if not getattr(job, "name", None) or not callable(getattr(job, "run", None)):
            return f"{_qualname(cls)}.periodic_jobs: {job!r} needs a name and run"
        if (every is None) == (at is None) or (every is not None and not every > 0) \
                or (at is not None and not _AT.fullmatch(str(at))):
            return (f"{_qualname(cls)}.periodic_jobs: {job.name!r} needs every (seconds) "
                    "or at (HH:MM), not both")
    migrations = getattr(cls, "migrations", None)
    if migrations is not None and not Path(migrations).is_dir():
        return f"{_qualname(cls)}.migrations: {migrations!r} is not a directory"
    return None


#: the configuration fields the core adds to every source type and every target type
#: (OpenPGP, docs/openpgp.md): the core applies them, around the plugin, which never
#: needs to read them
SOURCE_FIELDS = (
    Field("openpgp_decrypt", "boolean", False, label="OpenPGP: decrypt",
          help="Decrypt what is received with the key pair of the organization it is "
               "sent to (its openpgp profile): stored as raw, decrypted as unpacked; a "
               "message that is not encrypted to that key is refused"),
    Field("openpgp_verify", "boolean", False, label="OpenPGP: verify signature",
          help="Require a good OpenPGP signature by the sender's key (the partner's "
               "openpgp profile); a bad signature, none or another key's is refused"),
)
TARGET_FIELDS = (
    Field("openpgp_encrypt", "boolean", False, label="OpenPGP: encrypt",
          help="Encrypt the stage this target sends to the recipient's public key (its "
               "openpgp profile), stored as the message's sent stage"),
    Field("openpgp_sign", "boolean", False, label="OpenPGP: sign",
          help="Sign the stage this target sends with the sending organization's key "
               "pair (its openpgp profile)"),
)


def with_core_fields(cls: type) -> type:
    """Add :data:`SOURCE_FIELDS` / :data:`TARGET_FIELDS` to a type's ``config_schema``
    by its roles (a field of the same name the type declares itself is kept). The
    source fields go to the sources whose messages the core stores (the scheduled
    ones); a source with a receiving endpoint stores its messages itself and gets them
    when it says it applies them (``openpgp_intake = True``, through the plugin
    interface's ``openpgp_unpacker``)."""
    schema = list(getattr(cls, "config_schema", []))
    names = {f.name for f in schema}
    stores_itself = getattr(cls, "endpoint_prefix", None) is not None and not getattr(
        cls, "openpgp_intake", False)
    roles = {role for role in cls.roles if not (role == "source" and stores_itself)}
    added = [f for role, fields in (("source", SOURCE_FIELDS), ("target", TARGET_FIELDS))
             if role in roles for f in fields if f.name not in names]
    if added:
        cls.config_schema = [*schema, *added]
    return cls


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _distribution(entry_point: EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"


class PluginRegistry:
    """The plugin types known to this process, by type name."""

    def __init__(self, group: str = GROUP):
        self.group = group
        self.failures: dict[str, str] = {}
        self.loaded = False
        self._types: dict[str, type] = {}

    def load(self) -> None:
        """Register every class named in the entry-point group; record and log, but
        skip, those that fail to import or to pass :func:`plugin_problem`."""
        self.failures = {}
        for entry_point in entry_points(group=self.group):
            self._load_entry_point(entry_point)
        self.loaded = True

    def _load_entry_point(self, entry_point: EntryPoint) -> None:
        name, dist = entry_point.name, _distribution(entry_point)
        try:
            cls = entry_point.load()
        except Exception as exc:
            log.exception("plugin %r from %s failed to import; skipped", name, dist)
            self.failures[name] = f"import failed: {exc!r}"
            return
        problem = plugin_problem(cls, name)
        if problem is None:
            problem = self._clash(cls)
        if problem is not None:
            log.warning("plugin %r from %s skipped: %s", name, dist, problem)
            self.failures[name] = problem
            return
        self._types[name] = with_core_fields(cls)

    def _clash(self, cls: type) -> str | None:
        """A message if another class already holds this type name."""
        existing = self._types.get(cls.type_name)
        if existing is None or existing is cls:
            return None
        return f"type name {cls.type_name!r} is already taken by {_qualname(existing)}"

    def register(self, cls: type) -> type:
        """Add a plugin class by hand (tests do); returns it, so it works as a decorator.
        Registering the same class again is harmless; another class under a taken type
        name is a ValueError."""
        problem = plugin_problem(cls) or self._clash(cls)
        if problem is not None:
            raise ValueError(problem)
        self._types[cls.type_name] = with_core_fields(cls)
        return cls

    def get(self, type_name: str) -> type:
        """The class of a plugin type; KeyError names the known types."""
        try:
            return self._types[type_name]
        except KeyError:
            known = ", ".join(sorted(self._types)) or "none"
            raise KeyError(f"unknown plugin type {type_name!r}; known types: {known}") from None

    def types(self) -> dict[str, type]:
        """Every registered type by name, sorted by name."""
        return dict(sorted(self._types.items()))

    def sources(self) -> dict[str, type]:
        return {name: cls for name, cls in self.types().items() if "source" in cls.roles}

    def targets(self) -> dict[str, type]:
        return {name: cls for name, cls in self.types().items() if "target" in cls.roles}

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._types


registry = PluginRegistry()
_load_lock = threading.Lock()


def get_registry(load: bool = True) -> PluginRegistry:
    """The process-wide registry, its entry points loaded on first use (once, even when
    several threads ask together); ``load=False`` hands it out as it is."""
    if load and not registry.loaded:
        with _load_lock:
            if not registry.loaded:
                registry.load()
    return registry


# --- document inspectors (b2bhub.plugin.Inspector) -------------------------------

INSPECTOR_GROUP = "b2bhub.inspectors"
_inspectors: dict[str, Any] | None = None


def inspector_problem(obj: Any, entry_point_name: str) -> str | None:
    """What keeps ``obj`` from being the inspector named ``entry_point_name``."""
    if getattr(obj, "name", None) != entry_point_name:
        return f"{obj!r}.name is not {entry_point_name!r}"
    if not callable(getattr(obj, "recognise", None)) or not callable(
            getattr(obj, "inspect", None)):
        return f"{obj!r} needs recognise(head) and inspect(stream)"
    return None


def registered_inspectors() -> dict[str, Any]:
    """Every document inspector installed, by name, in name order, loaded once; one that
    fails to import or to look like an inspector is logged and skipped."""
    global _inspectors
    if _inspectors is None:
        with _load_lock:
            if _inspectors is None:
                found: dict[str, Any] = {}
                for ep in entry_points(group=INSPECTOR_GROUP):
                    try:
                        obj = ep.load()
                    except Exception:
                        log.exception("inspector %r from %s failed to import; skipped",
                                      ep.name, _distribution(ep))
                        continue
                    problem = inspector_problem(obj, ep.name)
                    if problem:
                        log.warning("inspector %r skipped: %s", ep.name, problem)
                        continue
                    found[ep.name] = obj
                _inspectors = dict(sorted(found.items()))
    return _inspectors


class InspectorsSettingError(ValueError):
    """``B2BHUB_INSPECTORS`` names an inspector that is not installed."""


_chosen: tuple[tuple[str, ...] | None, dict[str, Any]] | None = None


def choose_inspectors(names: tuple[str, ...] | None) -> dict[str, Any]:
    """The registered inspectors ``names`` chooses, in name order: all of them for None,
    none for ``()``; a name not registered is an :class:`InspectorsSettingError` naming
    the known ones."""
    known = registered_inspectors()
    if names is None:
        return known
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InspectorsSettingError(
            f"B2BHUB_INSPECTORS names {', '.join(map(repr, unknown))}, which "
            f"{'is not an' if len(unknown) == 1 else 'are not'} installed "
            f"inspector{'' if len(unknown) == 1 else 's'}; known inspectors: "
            f"{', '.join(known) or 'none'} (unset: all of them; empty: none)")
    return {name: obj for name, obj in known.items() if name in names}


def get_inspectors() -> dict[str, Any]:
    """The document inspectors that run at intake, by name, in name order: those the
    operator's ``B2BHUB_INSPECTORS`` chooses (:func:`choose_inspectors`), every
    registered one when it is unset. Read at every call (a dictionary look-up when the
    setting has not changed); the factory calls it once at start, so a name that is no
    inspector stops a process from starting."""
    global _chosen
    names = environment.inspector_names()
    chosen = _chosen
    if chosen is None or chosen[0] != names:
        chosen = _chosen = (names, choose_inspectors(names))
    return chosen[1]
