"""The house's plan, read from the code: how the modules of ``helpers`` import each other.

Three floors: what learners import (``helpers/*.py``), the course's own measuring and shipping
machinery (``helpers/maintainers/``) and what only an instructor runs (``helpers/instructor/``).
Imports point down, never up, and never in a circle; an import inside a function says why on its line.
The graph is read from the source (every ``import`` statement, those inside functions included),
not from what happens to be loaded, so an import that runs only on some path counts too.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from one_day import index  # helpers/__init__.py's table: the days that import each learner module

REPO = Path(__file__).resolve().parent.parent
FLOORS = ("learner", "maintainers", "instructor")  # bottom to top: a floor may import its own and those below


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(name: str, root: Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph(root: Path = REPO, package: str = "helpers") -> dict[str, dict[str, dict]]:
    """``{module: {imported module: {"line", "top_level", "text"}}}`` for every module of ``package`` under ``root``.

    ``from . import x`` names the submodule ``x`` where there is one; a module's own parent packages are
    left out (Python imports them first, whoever asks), and so are imports under ``if TYPE_CHECKING:``
    (for annotations: they never run). ``top_level``: not inside a function or class.
    """
    graph = {}
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root)
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  for n in ast.walk(f) if n is not f}
        for_annotations = {id(n) for f in ast.walk(tree) if isinstance(f, ast.If) and "TYPE_CHECKING" in ast.unparse(f.test)
                           for n in ast.walk(f) if n is not f}
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        parents = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
        edges: dict[str, dict] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                targets = [f"{base}.{alias.name}" for alias in node.names if _exists(f"{base}.{alias.name}", root)]
                if len(targets) < len(node.names):
                    targets.append(base)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            if id(node) in for_annotations:  # never runs: an annotation's import is no dependency
                continue
            for target in targets:
                if (target == package or target.startswith(package + ".")) and target != name and target not in parents:
                    edges.setdefault(target, {"line": node.lineno, "top_level": id(node) not in nested,
                                              "text": lines[node.lineno - 1]})
        graph[name] = edges
    return graph


def floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS[1:] else "learner"


def circles(graph: dict[str, dict]) -> list[list[str]]:
    """Every strongly connected group of modules (a circle), each as a path that closes on its first module."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in graph.get(node, {}):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(_path(graph, sorted(group)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _path(graph: dict[str, dict], group: list[str]) -> list[str]:
    """A circle through the group's first module, for the message."""
    start, members = group[0], set(group)
    paths = [[start]]
    while paths:
        path = paths.pop(0)
        for dep in sorted(graph.get(path[-1], {})):
            if dep == start:
                return path + [start]
            if dep in members and dep not in path:
                paths.append(path + [dep])
    return group


def imports_up(graph: dict[str, dict]) -> list[str]:
    """Imports from a floor to one above it (a learner module importing the maintainers' package, say)."""
    return [f"{module} (a {floor(module)} module) imports {dep} ({floor(dep)}), line {edge['line']}"
            for module, deps in sorted(graph.items()) for dep, edge in sorted(deps.items())
            if FLOORS.index(floor(dep)) > FLOORS.index(floor(module))]


def unexplained_late_imports(graph: dict[str, dict]) -> list[str]:
    """Imports of the course's own modules inside a function with no reason written beside them (a ``#`` comment)."""
    return [f"{module} line {edge['line']}: {edge['text'].strip()}"
            for module, deps in sorted(graph.items()) for dep, edge in sorted(deps.items())
            if not edge["top_level"] and "#" not in edge["text"]]


# ------------------------------------------------------------------ the house


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_is_read_from_every_module_and_import(graph):
    assert {"helpers.machine", "helpers.tuning", "helpers.maintainers.benchmark", "helpers.instructor.grading"} <= set(graph)
    assert "helpers.errors" in graph["helpers.machine"]  # a top-level ``from .errors import ...``
    assert "helpers.results" in graph["helpers.maintainers.report"]  # ``from ..results import ...``


def test_no_module_imports_itself_back_through_others(graph):
    found = circles(graph)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_imports_point_down_the_floors(graph):
    """Learner modules import neither the maintainers' package nor the instructor's; the maintainers' not the instructor's."""
    assert not imports_up(graph), "\n".join(imports_up(graph))


def test_an_import_inside_a_function_says_why(graph):
    assert not unexplained_late_imports(graph), "\n".join(unexplained_late_imports(graph))


# ------------------------------------------------------------- the test, tested


def _plant(root: Path, files: dict[str, str]) -> dict[str, dict]:
    for name, text in files.items():
        path = root / "helpers" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(root)


def test_a_planted_circle_is_found_even_through_an_import_inside_a_function(tmp_path):
    graph = _plant(tmp_path, {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "from .c import thing\n",
        "c.py": "def thing():\n    from .a import x  # (a reason)\n    return x\n",
        "d.py": "from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n    from . import e\n",
        "e.py": "from . import d\n",
    })
    assert circles(graph) == [["helpers.a", "helpers.b", "helpers.c", "helpers.a"]]
    assert not graph["helpers.c"]["helpers.a"]["top_level"]
    assert not unexplained_late_imports(graph)


def test_planted_imports_up_and_a_late_import_without_a_reason_are_found(tmp_path):
    graph = _plant(tmp_path, {
        "__init__.py": "",
        "gpu.py": "from .maintainers import table\n",
        "zoo.py": "def f():\n    from .instructor.grading import REPO\n    return REPO\n",
        "maintainers/__init__.py": "",
        "maintainers/table.py": "from .. import gpu\nfrom ..instructor import grading\n",
        "instructor/__init__.py": "",
        "instructor/grading.py": "from ..maintainers import table\nREPO = 1\n",
    })
    assert imports_up(graph) == [
        "helpers.gpu (a learner module) imports helpers.maintainers.table (maintainers), line 1",
        "helpers.maintainers.table (a maintainers module) imports helpers.instructor.grading (instructor), line 2",
        "helpers.zoo (a learner module) imports helpers.instructor.grading (instructor), line 2",
    ]
    assert unexplained_late_imports(graph) == ["helpers.zoo line 2: from .instructor.grading import REPO"]
    assert circles(graph)  # gpu -> maintainers.table -> gpu


# ------------------------------------------------------------- the index and the days


def learner_modules(root: Path = REPO) -> dict[str, Path]:
    """``{name: file}`` of every module a notebook may import: ``helpers/*.py`` and the packages beside them
    (``tuning``), but not the maintainers' and the instructor's."""
    found = {p.stem: p for p in (root / "helpers").glob("*.py") if p.stem != "__init__"}
    found.update({p.parent.name: p for p in (root / "helpers").glob("*/__init__.py") if p.parent.name not in FLOORS})
    return found


def notebook_imports(root: Path = REPO) -> dict[str, set[int]]:
    """``{module: days}`` from the code cells of ``solutions/*/*.ipynb``: ``from helpers import ...`` (in brackets
    over several lines too), ``from helpers.x import ...``, ``import helpers.x`` and ``helpers.x.name``."""
    found: dict[str, set[int]] = {}
    for path in sorted((root / "solutions").glob("day*/*.ipynb")):
        day = int(path.parent.name[3:5])
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            flat = re.sub(r"from helpers import \(([^)]*)\)", lambda m: "from helpers import " + " ".join(m[1].split()), source)
            names = [n.strip() for group in re.findall(r"^\s*from helpers import ([\w, ]+)", flat, re.M)
                     for n in group.split(",")]
            names += re.findall(r"^\s*from helpers\.(\w+)", source, re.M) + re.findall(r"^\s*import helpers\.(\w+)", source, re.M)
            names += re.findall(r"(?<!-m )\bhelpers\.(\w+)\.", source)   # not a command a cell prints
            for name in names:
                found.setdefault(name, set()).add(day)
    return found


def test_the_index_lists_every_learner_module_with_the_days_that_import_it():
    listed, modules, used = index(), learner_modules(), notebook_imports()
    assert set(listed) == set(modules), f"unlisted: {sorted(set(modules) - set(listed))}; gone: {sorted(set(listed) - set(modules))}"
    assert set(used) <= set(modules), f"notebooks import modules that are not learner modules: {sorted(set(used) - set(modules))}"
    wrong = {name: (sorted(days), sorted(used.get(name, set()))) for name, days in listed.items() if days != used.get(name, set())}
    assert not wrong, f"(index, notebooks) disagree: {wrong}"


def test_each_learner_module_names_the_day_that_introduces_it():
    for name, days in index().items():
        if days:
            doc = ast.get_docstring(ast.parse(learner_modules()[name].read_text())) or ""
            assert f"Introduced on Day {min(days)}." in doc, f"helpers.{name}'s docstring should say 'Introduced on Day {min(days)}.'"


def closure(graph: dict[str, dict], start: set[str]) -> set[str]:
    """Every module of the course that importing ``start`` loads (its package ``__init__``s included)."""
    seen, todo = set(), [*start]
    while todo:
        module = todo.pop()
        if module in seen or module not in graph:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))] + list(graph[module])
    return seen


def test_day_0_loads_a_handful_of_modules(graph):
    """Day 0 needs the machine, a model, a build and one arithmetic function: not the whole course."""
    day0 = {f"helpers.{name}" for name, days in notebook_imports().items() if 0 in days}
    loaded = closure(graph, day0)
    assert len(loaded) <= 12, sorted(loaded)


def test_every_command_a_document_shows_is_a_module_that_runs():
    """``python -m helpers.x ...`` in the Makefile, docs/, results/README.md and the helpers' own text names a
    module with a ``__main__`` block (a command moved with its module would otherwise be documented dead)."""
    sources = [REPO / "Makefile", REPO / "results" / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "helpers").rglob("*.py")]
    named = {(m, path.name) for path in sources for m in re.findall(r"python -m (helpers(?:\.\w+)+)\b(?!\.<)", path.read_text())}
    assert named
    dead = sorted((m, where) for m, where in named
                  if not _exists(m, REPO) or '__name__ == "__main__"' not in REPO.joinpath(*m.split(".")).with_suffix(".py").read_text())
    assert not dead, dead


def test_every_package_of_helpers_is_installed():
    """pyproject.toml names the packages a non-editable install copies: a new subpackage must be one of them."""
    text = (REPO / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(helpers(?:\.\w+)*)"', re.search(r"^packages = \[(.*)\]$", text, re.M)[1]))
    assert listed == {module_name(p, REPO) for p in (REPO / "helpers").rglob("__init__.py")}
