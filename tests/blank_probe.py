"""Every graded test fails on what the learner is handed, proved inside the solution's own run.

The grading gate autogrades each day's solution once. Into that submission, after each exercise,
go probe cells (no nbgrader metadata: the grader runs them like any cell a learner adds): a
snapshot of the kernel's names, with the names the replayed cells bind removed (on the blank, a
cell that fails binds nothing); the exercise's cells again from its first solution cell to its last test cell, with each solution
cell replaced by its student version from the committed ``notebooks/`` and each test cell in
full (visible and hidden tests, as autograde restores them); then the snapshot restored, so that
the rest of the solution runs as before. Each test cell replayed on the blank must fail as
autograde scores a failure (an error, or output on stderr); one that passes is a test that
cannot fail. The probe cells are removed again before the run is compared with the stored
outputs and published.
"""

from __future__ import annotations

import ast
import copy
import json

import nbformat

from helpers.instructor import exercises

PROBE = "course_blank_probe"


def bound_names(source: str) -> set[str]:
    """Names a cell binds at top level (assignments, definitions, imports, loop and with targets)."""
    try:
        return bound_in(ast.parse(source).body)
    except SyntaxError:
        return set()


def bound_in(statements: list[ast.stmt]) -> set[str]:
    """Names ``statements`` bind at top level: ``bound_names`` of parsed code."""
    names: set[str] = set()
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
              ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            return
        if isinstance(node, scopes):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in statements:
        visit(statement)
    return names


SNAPSHOT = """__probe_saved = dict(globals())
for __probe_name in {names!r}:
    globals().pop(__probe_name, None)
del __probe_name"""

RESTORE = """def __probe_restore(names, saved):
    for name in [name for name in names if name not in saved]:
        del names[name]
    names.update(saved)
__probe_restore(globals(), __probe_saved)"""


def _probe_cell(source: str, exercise: int, role: str, grade_id: str | None = None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata[PROBE] = {"exercise": exercise, "role": role, **({"grade_id": grade_id} if grade_id else {})}
    return cell


def with_probes(solution: nbformat.NotebookNode, student: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The solution with a probe after each autograded exercise (see the module's docstring)."""
    stubs = {exercises.grader(c)["grade_id"]: c.source for c in student.cells
             if c.cell_type == "code" and exercises.grader(c).get("solution")}
    probed = copy.deepcopy(solution)
    inserts = []
    for ex in exercises.read(solution):
        if not ex.tests:
            continue
        by_id = {exercises.grader(solution.cells[i]).get("grade_id"): i for i in ex.cells}
        first = min(by_id[g] for g in ex.solutions) if ex.solutions else min(by_id[g] for g in ex.tests)
        last = max(by_id[g] for g in ex.tests)
        replayed = [i for i in range(first, last + 1) if solution.cells[i].cell_type == "code"]
        # What the replayed cells bind is unbound first: on the blank, a cell that fails binds nothing.
        names = set().union(*(bound_names(solution.cells[i].source) for i in replayed))
        cells = [_probe_cell(SNAPSHOT.format(names=sorted(names)), ex.number, "snapshot")]
        for index in replayed:
            cell = solution.cells[index]
            meta = exercises.grader(cell)
            if meta.get("solution"):
                if meta["grade_id"] not in stubs:
                    raise ValueError(f"{meta['grade_id']} has no student version in the release: regenerate it")
                cells.append(_probe_cell(stubs[meta["grade_id"]], ex.number, "stub", meta["grade_id"]))
            elif meta.get("grade"):
                cells.append(_probe_cell(cell.source, ex.number, "test", meta["grade_id"]))
            else:
                cells.append(_probe_cell(cell.source, ex.number, "lesson"))
        cells.append(_probe_cell(RESTORE, ex.number, "restore"))
        inserts.append((last + 1, cells))
    for position, cells in sorted(inserts, key=lambda item: item[0], reverse=True):
        probed.cells[position:position] = cells
    return probed


def _failed(cell) -> bool:
    return any(out.get("output_type") == "error" or out.get("name") == "stderr" for out in cell.get("outputs", []))


def tests_passing_on_the_blank(executed: nbformat.NotebookNode) -> list[str]:
    """The test cells that passed when replayed on their exercise's student version (none may)."""
    return [f"{cell.metadata[PROBE]['grade_id']} (exercise {cell.metadata[PROBE]['exercise']}) passes on the blank "
            "student version: a test that cannot fail"
            for cell in executed.cells
            if cell.metadata.get(PROBE, {}).get("role") == "test" and not _failed(cell)]


def probes_that_broke(executed: nbformat.NotebookNode) -> list[str]:
    """Snapshot and restore cells that raised: the solution after them would not run as it should."""
    return [f"the probe's {cell.metadata[PROBE]['role']} cell of exercise {cell.metadata[PROBE]['exercise']} raised: "
            + json.dumps([o.get("evalue", "") for o in cell.outputs])[:300]
            for cell in executed.cells
            if cell.metadata.get(PROBE, {}).get("role") in ("snapshot", "restore") and _failed(cell)]


def probed_test_count(executed: nbformat.NotebookNode) -> int:
    return sum(cell.metadata.get(PROBE, {}).get("role") == "test" for cell in executed.cells)


def without_probes(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook as the solution alone (what the stored outputs and the site compare and publish)."""
    clean = copy.deepcopy(nb)
    clean.cells = [cell for cell in clean.cells if PROBE not in cell.metadata]
    return clean
