"""Plugin types come from entry points of any installed package; a broken one is
logged and skipped, never fatal."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import pytest

from b2bhub.plugin import registry as registry_module
from b2bhub.plugin.registry import PluginRegistry, get_registry, plugin_problem
from b2bhub.plugin.schema import Field

PLUGIN_DIST = Path(__file__).parent / "plugin_dist"


class Poller:
    type_name = "test_poller"
    roles = frozenset({"source"})
    config_schema = [Field("base_directory", "path", required=True)]


class Writer:
    type_name = "test_writer"
    roles = frozenset({"target"})
    config_schema: list = []


class Relay:
    type_name = "test_relay"
    roles = frozenset({"source", "target"})
    config_schema: list = []


def make_plugin(type_name="test_writer", roles=frozenset({"target"}), schema=()):
    return type("Made", (), {"type_name": type_name, "roles": roles, "config_schema": list(schema)})


@pytest.fixture
def installed(monkeypatch):
    """Put a folder on sys.path as if a distribution were installed there; the modules
    imported from it are forgotten afterwards, so each test imports them afresh."""
    folders: list[Path] = []

    def install(folder: Path) -> None:
        monkeypatch.syspath_prepend(str(folder))
        importlib.invalidate_caches()
        folders.append(folder)

    yield install
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and any(Path(origin).is_relative_to(folder) for folder in folders):
            del sys.modules[name]
    importlib.invalidate_caches()


def write_fake_distribution(root: Path) -> None:
    info = root / "fakepkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[b2bhub.plugins]\ngood_target = fakepkg_mod:GoodTarget\nbroken = fakepkg_broken:Thing\n"
    )
    (root / "fakepkg_mod.py").write_text(
        "class GoodTarget:\n"
        "    type_name = 'good_target'\n"
        "    roles = frozenset({'target'})\n"
        "    config_schema = []\n"
    )
    (root / "fakepkg_broken.py").write_text("raise ImportError('needs a missing library')\n")


def test_register_by_hand():
    plugins = PluginRegistry()
    for cls in (Poller, Writer, Relay):
        assert plugins.register(cls) is cls
    assert plugins.get("test_writer") is Writer
    assert "test_poller" in plugins and "nothing" not in plugins
    assert list(plugins.types()) == ["test_poller", "test_relay", "test_writer"]
    assert list(plugins.sources()) == ["test_poller", "test_relay"]
    assert list(plugins.targets()) == ["test_relay", "test_writer"]


def test_registering_the_same_class_twice_is_harmless():
    plugins = PluginRegistry()
    plugins.register(Writer)
    plugins.register(Writer)
    assert plugins.types() == {"test_writer": Writer}


def test_a_taken_type_name_is_refused():
    plugins = PluginRegistry()
    plugins.register(Writer)
    with pytest.raises(ValueError, match="already taken"):
        plugins.register(make_plugin("test_writer"))
    assert plugins.get("test_writer") is Writer


def test_unknown_type_names_the_known_ones():
    plugins = PluginRegistry()
    plugins.register(Writer)
    plugins.register(Poller)
    with pytest.raises(KeyError, match="'ftp'; known types: test_poller, test_writer"):
        plugins.get("ftp")


@pytest.mark.parametrize(
    "cls, words",
    [
        (make_plugin(type_name=""), "no type_name"),
        (make_plugin(roles=frozenset()), "roles"),
        (make_plugin(roles=frozenset({"sink"})), "roles"),
        (make_plugin(roles="target"), "roles"),
        (make_plugin(schema=["url"]), "not a Field"),
        (Writer(), "not a class"),
    ],
)
def test_what_is_not_a_plugin_is_refused(cls, words):
    assert words in plugin_problem(cls)
    with pytest.raises(ValueError):
        PluginRegistry().register(cls)


def test_entry_point_name_must_match_type_name():
    assert plugin_problem(Writer, "test_writer") is None
    assert "entry point" in plugin_problem(Writer, "writer")


def test_separately_installed_plugin_is_found_and_broken_one_skipped(tmp_path, installed, caplog):
    write_fake_distribution(tmp_path)
    installed(tmp_path)
    plugins = PluginRegistry()

    with caplog.at_level(logging.WARNING, logger="b2bhub.plugins"):
        plugins.load()

    assert plugins.get("good_target").__module__ == "fakepkg_mod"
    assert "broken" not in plugins
    assert "needs a missing library" in plugins.failures["broken"]
    assert "good_target" not in plugins.failures
    [record] = [r for r in caplog.records if "'broken'" in r.getMessage()]
    assert record.name == "b2bhub.plugins"
    assert "fakepkg 1.0" in record.getMessage()
    assert record.exc_info is not None


def test_mismatched_entry_point_is_skipped_with_a_warning(tmp_path, installed, caplog):
    write_fake_distribution(tmp_path)
    entry_points = tmp_path / "fakepkg-1.0.dist-info" / "entry_points.txt"
    entry_points.write_text("[b2bhub.plugins]\nother_name = fakepkg_mod:GoodTarget\n")
    installed(tmp_path)
    plugins = PluginRegistry()

    with caplog.at_level(logging.WARNING, logger="b2bhub.plugins"):
        plugins.load()

    assert "good_target" not in plugins and "other_name" not in plugins
    assert "entry point" in plugins.failures["other_name"]
    assert any(
        "other_name" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records
    )


def test_test_plugin_distribution_is_found(installed):
    installed(PLUGIN_DIST)
    plugins = PluginRegistry()
    plugins.load()

    echo = plugins.get("external_echo")
    assert "external_echo" in plugins.targets()
    assert "external_echo" not in plugins.failures
    outcome = echo("echo", {}).deliver(None, None, None)
    assert (outcome.kind, outcome.text) == ("delivered", "echoed")


def test_get_registry_loads_entry_points_once(monkeypatch):
    calls = []
    fresh = PluginRegistry()
    monkeypatch.setattr(registry_module, "registry", fresh)
    monkeypatch.setattr(fresh, "load", lambda: (calls.append(1), setattr(fresh, "loaded", True)))

    assert get_registry(load=False) is fresh and calls == []
    assert get_registry() is fresh
    assert get_registry() is fresh
    assert calls == [1]
