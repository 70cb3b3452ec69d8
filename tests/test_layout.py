"""The layout docs/design.md draws ("Where things live") is the code's: each package
imports only what its row allows, and the domain core and the engine reach neither Flask
nor Celery, not even through a module they import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"

#: the frameworks a row may name, and the top-level modules each stands for
FRAMEWORKS = {
    "Flask": ("flask", "flask_sqlalchemy", "flask_login", "flask_wtf", "flask_migrate",
              "flask_smorest", "werkzeug", "jinja2"),
    "Celery": ("celery", "kombu", "billiard"),
    "SQLAlchemy": ("sqlalchemy", "alembic"),
}


def layout_table() -> dict[str, set[str]]:
    """Each row of the design notes' table: its path (``b2bhub/engine/``) and what it may
    import (packages by name, frameworks by their names; ``b2bhub`` is the factory). The
    column's text after a colon or semicolon, and inside parentheses, is commentary."""
    text = DESIGN.read_text()
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        allowed_text = re.split(r"[:;]", re.sub(r"\([^)]*\)", "", cells[2]))[0]
        allowed = set(re.findall(r"`([a-z_]+)`", allowed_text))
        if re.search(r"\bthe factory\b", allowed_text):
            allowed.add("b2bhub")
        allowed |= {name for name in FRAMEWORKS if re.search(rf"\b{name}\b", allowed_text)}
        for path in re.findall(r"`([^`]+)`", cells[0]):
            rows[path] = allowed
    return rows


def row_of(path: Path, rows: dict[str, set[str]]) -> str:
    rel = path.relative_to(ROOT).as_posix()
    for key in sorted(rows, key=len, reverse=True):
        if rel == key or (key.endswith("/") and rel.startswith(key)):
            return key
    raise AssertionError(f"{rel} is in no row of docs/design.md's layout table")


def package_of(module: str) -> str | None:
    """The name a row uses for an imported module: ``b2bhub.engine.claim`` is ``engine``,
    ``b2bhub`` the factory, ``plugins.as2`` is ``plugins``, ``flask_login`` Flask."""
    parts = module.split(".")
    if parts[0] == "b2bhub":
        return "b2bhub" if len(parts) == 1 else ("factory" if parts[1] == "cli" else parts[1])
    if parts[0] == "plugins":
        return "plugins"
    for name, tops in FRAMEWORKS.items():
        if parts[0] in tops:
            return name
    return None


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at its top or inside a function. ``from b2bhub
    import x`` imports the module ``b2bhub.x`` when ``x`` is one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if _module_file(sub) is not None:
                    found.append((node.lineno, sub))
    return found


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _sources() -> list[Path]:
    return sorted([*ROOT.joinpath("b2bhub").rglob("*.py"), *ROOT.joinpath("plugins").rglob("*.py")])


def test_the_table_names_every_package_of_b2bhub():
    rows = layout_table()
    packages = {p.name for p in ROOT.joinpath("b2bhub").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert {f"b2bhub/{name}/" for name in packages} <= set(rows)
    assert {"b2bhub/__init__.py", "b2bhub/cli.py", "plugins/"} <= set(rows)
    loose = sorted(p.name for p in ROOT.joinpath("b2bhub").glob("*.py"))
    assert loose == ["__init__.py", "cli.py"], "b2bhub/ keeps its factory, cli.py and packages"


def test_every_import_is_one_its_row_allows():
    rows = layout_table()
    wrong = []
    for path in _sources():
        row = row_of(path, rows)
        own = package_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        if row in ("b2bhub/__init__.py", "b2bhub/cli.py"):
            own = "factory"
        for line, module in imports_of(path):
            target = package_of(module)
            if target is None or target == own or (own == "factory" and target == "b2bhub"):
                continue
            if target not in rows[row]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module} "
                             f"({target} is not in the row of {row})")
    assert not wrong, "\n".join(wrong)


def test_the_table_check_fails_on_a_forbidden_import(tmp_path, monkeypatch):
    """The check above sees a lazy import of the web layer from the engine."""
    engine_module = ROOT / "b2bhub" / "engine" / "dispatch.py"
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from b2bhub.web import kit\n    import flask\n")
    rows = layout_table()
    allowed = rows[row_of(engine_module, rows)]
    found = [package_of(module) for _, module in imports_of(bad)]
    assert found == ["web", "web", "Flask"]
    assert not set(found) & allowed


def _reached(start: list[str]) -> dict[str, str]:
    """The b2bhub modules ``start`` reaches by its imports (explicit ones; a parent
    package is not counted for its children), each with the module that first imported
    it, for the message."""
    seen = {module: "" for module in start}
    todo = list(start)
    while todo:
        module = todo.pop()
        path = _module_file(module)
        if path is None:
            continue
        for _, imported in imports_of(path):
            if imported.split(".")[0] == "b2bhub" and imported != "b2bhub" \
                    and imported not in seen and _module_file(imported) is not None:
                seen[imported] = module
                todo.append(imported)
    return seen


def test_the_domain_core_and_the_engine_reach_neither_flask_nor_celery():
    start = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for d in ("domain", "engine") for p in ROOT.joinpath("b2bhub", d).rglob("*.py")]
    reached = _reached(start)
    wrong = []
    for module, by in reached.items():
        for line, imported in imports_of(_module_file(module)):
            if package_of(imported) in ("Flask", "Celery"):
                wrong.append(f"{module}:{line} imports {imported}" + (f" (reached from {by})"
                                                                       if by else ""))
    assert not wrong, "\n".join(wrong)
    assert "b2bhub.plugin" in reached  # the engine uses the plugin interface, which is plain
