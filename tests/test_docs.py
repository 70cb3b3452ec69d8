"""Every setting and command a user reads about exists, and every one that exists is
documented: the README's tables are checked against the code."""

from __future__ import annotations

import re
from pathlib import Path

from b2bhub import config
from b2bhub.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_environment_variable_is_in_the_readme_table():
    documented = set(re.findall(r"^\| `(B2BHUB_[A-Z0-9_]+)` \|", README, re.M))
    assert documented == {name for name, _, _ in config.VARIABLES}


def test_every_variable_the_code_reads_is_declared():
    read = set()
    for path in (ROOT / "b2bhub").rglob("*.py"):
        read |= set(re.findall(r"\"(B2BHUB_[A-Z0-9_]+)\"", path.read_text()))
    read |= set(re.findall(r"\"(B2BHUB_[A-Z0-9_]+)\"", (ROOT / "celeryconfig.py").read_text()))
    assert read <= {name for name, _, _ in config.VARIABLES}


def test_the_command_table_names_real_commands():
    documented = re.findall(r"^\| `b2bhub ([a-z]+)(?: ([a-z]+))?", README, re.M)
    assert documented, "the README lists the b2bhub commands"
    for group, sub in documented:
        command = main.get_command(None, group) if group != "db" else True
        assert command is not None, f"b2bhub {group}"
        if sub and group != "db":
            assert sub in command.commands, f"b2bhub {group} {sub}"


def test_makefile_has_the_two_commands():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert "make run" in README and "make test" in README
