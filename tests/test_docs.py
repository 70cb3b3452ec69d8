"""The README is a user guide and the docs site covers what a user can set and run
(issue 20, item 6): the README stays short, `mkdocs build --strict` passes, every
environment variable b2bhub reads and every command of the `b2bhub` CLI is documented
under `docs/`, and the README's first-run fixtures file is the one in `examples/`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click

from b2bhub.cli import main
from b2bhub.config import environment as config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md")))


def test_the_readme_is_a_short_user_guide():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    for heading in ("## Two commands", "## A first run", "## Processes", "## Where to read on"):
        assert heading in readme
    assert "b2bhub fixtures load examples/first-run.json" in readme
    # every page the README points to exists
    for target in re.findall(r"\]\(((?:docs|bench)/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target


def test_the_docs_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def read_variables() -> set[str]:
    """Every variable b2bhub's own code reads: the configuration tables, and any
    ``B2BHUB_*`` name written anywhere in the code of the hub and its plugins."""
    names = {name for name, *_ in config.VARIABLES}
    names |= {name for name, *_ in config.PLATFORM_VARIABLES}
    for path in [*(ROOT / "b2bhub").rglob("*.py"), *(ROOT / "plugins").rglob("*.py"),
                 ROOT / "celeryconfig.py", ROOT / "wsgi.py"]:
        names |= set(re.findall(r"\bB2BHUB_[A-Z0-9_]+\b", path.read_text(encoding="utf-8")))
    return names


def test_every_environment_variable_is_documented():
    text = docs_text()
    variables = read_variables()
    assert {"B2BHUB_DATA_DIR", "B2BHUB_DATABASE_URL", "DATABASE_URL"} <= variables
    missing = sorted(v for v in variables if f"`{v}`" not in text)
    assert not missing, f"not in docs/: {missing}"


def commands(group: click.Group, prefix: str = "b2bhub") -> list[str]:
    found = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}"
        if isinstance(command, click.Group):
            found += commands(command, path)
        else:
            found.append(path)
    return found


def test_every_cli_command_is_documented():
    text = docs_text()
    # b2bhub's own commands and Flask's (shell, routes); of Flask-Migrate's `db` group,
    # which the app adds when it loads, the one a user runs
    every = commands(main) + ["b2bhub db upgrade"]
    assert {"b2bhub run", "b2bhub fixtures load", "b2bhub cleanup"} <= set(every)
    missing = [c for c in every if f"`{c}" not in text]
    assert not missing, f"not in docs/: {missing}"


def test_the_configuration_table_is_the_declared_variables():
    table = (DOCS / "configuration.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(B2BHUB_[A-Z0-9_]+)` \|", table, re.M))
    assert documented == {name for name, _, _ in config.VARIABLES}


def test_every_variable_the_code_reads_is_declared():
    read = set()
    for path in [*(ROOT / "b2bhub").rglob("*.py"), ROOT / "celeryconfig.py"]:
        read |= set(re.findall(r"\"(B2BHUB_[A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    assert read <= {name for name, _, _ in config.VARIABLES}


def test_the_command_table_names_real_commands():
    guide = (DOCS / "operator-guide.md").read_text(encoding="utf-8")
    documented = re.findall(r"^\| `b2bhub ([a-z]+)(?: ([a-z]+))?", guide, re.M)
    assert documented, "the operator guide lists the b2bhub commands"
    for group, sub in documented:
        command = main.get_command(None, group) if group != "db" else True
        assert command is not None, f"b2bhub {group}"
        if sub and group != "db":
            assert sub in command.commands, f"b2bhub {group} {sub}"


def test_makefile_has_the_two_commands():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^run: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert "make run" in readme and "make test" in readme
