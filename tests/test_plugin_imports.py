"""Plugins only through the interface (issue 37): every built-in plugin under
``plugins/`` uses b2bhub's documented plugin interface, ``b2bhub.plugin`` (and its
submodule ``b2bhub.plugin.schema``), and nothing else of b2bhub: no import of the core's
modules, no core model taken from the interface, no SQL text naming a core table. A
plugin's own tables (declared on ``Base``, migrated through its ``migrations`` hook)
are its own. And b2bhub's modules import each other without cycles at their top level
(a function's lazy import is deliberate and not counted)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "plugins"
CORE = ROOT / "b2bhub"
#: what a plugin may import of b2bhub
ALLOWED = {"b2bhub.plugin", "b2bhub.plugin.schema"}
#: names of the interface that hand out the core's database as a whole
FORBIDDEN_NAMES = {"db"}


# --- reading the source -------------------------------------------------------------

def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "build" not in p.parts)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _module_name(path: Path, root: Path | None = None) -> str:
    """``plugins/as2/lib.py``: ``plugins.as2.lib`` (from the nearest ``plugins`` or
    ``b2bhub`` directory up, so that a file written elsewhere names itself alike)."""
    parts = list(path.with_suffix("").parts)
    start = max(i for i, part in enumerate(parts) if part in ("plugins", "b2bhub"))
    parts = parts[start:]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute module a ``from`` import names (relative ones resolved)."""
    if not level:
        return module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def imports_of(path: Path, top_level_only: bool = False
               ) -> list[tuple[int, str, str | None]]:
    """Each import of a file as (line, module, name taken from it or None): ``import x``,
    ``from x import y`` (relative ones resolved), and the string targets of
    ``importlib.import_module`` / ``__import__``. ``top_level_only``: only what runs
    when the module is imported (not inside functions, nor under ``TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    importer = _module_name(path)
    package = path.name == "__init__.py"
    found: list[tuple[int, str, str | None]] = []

    def visit(node: ast.AST) -> None:
        if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.Lambda)):
            return
        if top_level_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
                node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node.module, node.level, importer, package)
            found.extend((node.lineno, module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and node.args and isinstance(
                    node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value, None))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _b2bhub_module(module: str, name: str | None, root: Path = ROOT) -> str | None:
    """The b2bhub module an import reaches (``from b2bhub import engine``: b2bhub.engine),
    None when it is not b2bhub's."""
    if module != "b2bhub" and not module.startswith("b2bhub."):
        return None
    if name and name != "*":
        candidate = f"{module}.{name}"
        where = root.joinpath(*candidate.split("."))
        if where.with_suffix(".py").exists() or (where / "__init__.py").exists():
            return candidate
    return module


# --- the rules ---------------------------------------------------------------------

def core_tables() -> set[str]:
    """The core's tables: those of b2bhub's own models (a plugin's, mapped by a class
    outside b2bhub, are the plugin's)."""
    from b2bhub.models import Base  # (the package maps every core model)
    tables = {mapper.local_table.name for mapper in Base.registry.mappers
              if mapper.class_.__module__.startswith("b2bhub.")}
    assert {"parties", "plugin_instances", "settings", "messages", "deliveries",
            "history", "payloads", "protocol_profiles", "certificates"} <= tables
    return tables


def core_models() -> set[str]:
    """The names of the ORM classes mapped on the core's tables."""
    from b2bhub.models import Base
    return {mapper.class_.__name__ for mapper in Base.registry.mappers
            if mapper.class_.__module__.startswith("b2bhub.")}


def forbidden_imports(paths: list[Path]) -> list[str]:
    """Every import of a b2bhub module other than the interface, and every core model
    (or the database object) named from the interface."""
    models, problems = core_models(), []
    for path in paths:
        for line, module, name in imports_of(path):
            reached = _b2bhub_module(module, name)
            where = f"{_shown(path)}:{line}"
            if reached is None:
                continue
            if reached not in ALLOWED:
                problems.append(f"{where}: imports {reached}"
                                + (f" ({name})" if name else ""))
            elif name in models or name in FORBIDDEN_NAMES:
                problems.append(f"{where}: takes the core's {name} from {reached}")
    return problems


def _sql_over(tables: set[str]) -> re.Pattern:
    names = "|".join(sorted(map(re.escape, tables), key=len, reverse=True))
    return re.compile(rf"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+[\"`]?(?:{names})\b[\"`]?"
                      r"(?!\.)", re.IGNORECASE)


def sql_over_core_tables(paths: list[Path]) -> list[str]:
    """Every string (but docstrings) that reads like SQL over a core table, and every
    core table named to SQLAlchemy by its name (``table("parties")``,
    ``Table("parties", ...)``, ``metadata.tables["parties"]``)."""
    tables = core_tables()
    pattern, problems = _sql_over(tables), []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docs and (found := pattern.search(node.value)):
                problems.append(f"{_shown(path)}:{node.lineno}: SQL over a core "
                                f"table: {found.group(0)!r}")
            named = None
            if isinstance(node, ast.Call) and node.args and (
                    getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            ) in ("table", "Table"):
                named = node.args[0]
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "tables":
                named = node.slice
            if isinstance(named, ast.Constant) and named.value in tables:
                problems.append(f"{_shown(path)}:{node.lineno}: names the core table "
                                f"{named.value!r}")
    return problems


def import_cycles(paths: list[Path], root: Path = ROOT) -> list[list[str]]:
    """The cycles of b2bhub's modules' top-level imports (each strongly connected
    component of more than one module, or a module importing itself)."""
    graph: dict[str, set[str]] = {}
    for path in paths:
        importer = _module_name(path)
        graph.setdefault(importer, set())
        for _line, module, name in imports_of(path, top_level_only=True):
            reached = _b2bhub_module(module, name, root)
            if reached is not None:
                graph[importer].add(reached)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in graph:
                continue
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def _cycle_path(graph_paths: list[Path], component: list[str], root: Path = ROOT) -> str:
    """One loop through a component, for the failure's message."""
    members = set(component)
    edges = {_module_name(p): {r for _l, m, n in imports_of(p, top_level_only=True)
                               if (r := _b2bhub_module(m, n, root)) in members}
             for p in graph_paths if _module_name(p) in members}
    start = component[0]
    trail, seen, node = [start], {start}, start
    while True:
        following = sorted(edges.get(node, ()))
        if start in following and len(trail) > 1 or not following:
            break
        node = next((n for n in following if n not in seen), following[0])
        if node in seen:
            trail.append(node)
            break
        trail.append(node)
        seen.add(node)
    return " -> ".join(trail + ([start] if trail[-1] != start else []))


# --- the tests -------------------------------------------------------------------

def test_plugins_import_only_the_plugin_interface():
    problems = forbidden_imports(_python_files(PLUGINS))
    assert not problems, "plugins reach past b2bhub.plugin:\n" + "\n".join(problems)


def test_the_interface_exports_no_core_model():
    import b2bhub.plugin as interface
    tables = core_tables()
    names = set(interface._PROTOCOL_API) | {n for n in vars(interface)
                                            if not n.startswith("_")}
    exported = []
    for name in sorted(names):
        value = getattr(interface, name)
        table = getattr(value, "__table__", None)
        if name in FORBIDDEN_NAMES or (isinstance(value, type) and table is not None
                                       and table.name in tables):
            exported.append(name)
    assert not exported, f"b2bhub.plugin exports the core's models: {exported}"


def test_plugins_write_no_sql_over_core_tables():
    problems = sql_over_core_tables(_python_files(PLUGINS))
    assert not problems, "\n".join(problems)


def test_b2bhub_has_no_import_cycle():
    paths = _python_files(CORE)
    cycles = import_cycles(paths)
    assert not cycles, "import cycles among b2bhub's modules (top-level imports):\n" + \
        "\n".join(_cycle_path(paths, c) for c in cycles)


# --- each check fails on what it is there to catch -------------------------------

@pytest.mark.parametrize("source, expected", [
    ("from b2bhub.models import Party\n", "imports b2bhub.models"),
    ("def f():\n    from b2bhub.engine.runner import TargetRunner\n",
     "imports b2bhub.engine.runner"),
    ("import b2bhub.runtime.hub\n", "imports b2bhub.runtime.hub"),
    ("from b2bhub import engine\n", "imports b2bhub.engine"),
    ("import importlib\nimportlib.import_module('b2bhub.engine.wakeups')\n",
     "imports b2bhub.engine.wakeups"),
    ("from b2bhub.plugin import Party\n", "takes the core's Party"),
    ("from b2bhub.plugin import db\n", "takes the core's db"),
])
def test_a_forbidden_import_is_caught(tmp_path, source, expected):
    problems = forbidden_imports([_probe(tmp_path, source)])
    assert len(problems) == 1 and expected in problems[0], problems


def test_allowed_imports_pass(tmp_path):
    probe = _probe(tmp_path, "from b2bhub.plugin import Plugin, EndpointLookup\n"
                             "from b2bhub.plugin.schema import Field\n"
                             "from plugins.as2 import lib\nfrom . import lib as same\n"
                             "import sqlalchemy\n")
    assert forbidden_imports([probe]) == []


def test_sql_over_a_core_table_is_caught(tmp_path):
    probe = _probe(tmp_path, '"""Reads FROM parties in its docstring: fine."""\n'
                             'Q = "SELECT kind FROM parties WHERE name = :n"\n'
                             'OWN = "SELECT id FROM as2_inbound"\n'
                             'FK = "messages.id"\n'
                             'T = sqlalchemy.table("settings")\n'
                             'M = Base.metadata.tables["deliveries"]\n'
                             'O = Base.metadata.tables["as2_outbound"]\n')
    problems = sql_over_core_tables([probe])
    assert len(problems) == 3, problems
    assert "FROM parties" in problems[0] and "'settings'" in problems[1] \
        and "'deliveries'" in problems[2], problems


def test_an_import_cycle_is_caught(tmp_path):
    package = tmp_path / "b2bhub"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("from b2bhub.two import x\n")
    (package / "two.py").write_text("import b2bhub.one\nx = 1\n"
                                    "def later():\n    import b2bhub.three\n")
    (package / "three.py").write_text("from b2bhub import one\n")
    (package / "four.py").write_text("from typing import TYPE_CHECKING\n"
                                     "if TYPE_CHECKING:\n    import b2bhub.five\n")
    (package / "five.py").write_text("import b2bhub.four\n")
    paths = sorted(package.glob("*.py"))
    cycles = import_cycles(paths, tmp_path)
    assert cycles == [["b2bhub.one", "b2bhub.two"]], cycles
    assert _cycle_path(paths, cycles[0], tmp_path) == "b2bhub.one -> b2bhub.two -> b2bhub.one"


def _probe(tmp_path: Path, source: str) -> Path:
    """A plugin's file with ``source``, written outside the tree."""
    where = tmp_path / "plugins"
    where.mkdir(exist_ok=True)
    path = where / "probe.py"
    path.write_text(source)
    return path
