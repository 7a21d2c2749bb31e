"""Every exercise stands alone: its solution and its tests need no other exercise's answer.

A learner who leaves Exercise 1 blank must still earn Exercise 3's points when Exercise 3 is right. On a
blank exercise its solution cells raise and bind nothing, and so does every later cell that uses a name
they would have bound. This module follows the names of a source notebook, cell by cell, as Python
binds them at top level: each binding remembers which exercises' solutions it came from (directly, or
through lesson cells that used them). A solution or test cell of one exercise that reads a name coming
from another exercise depends on it, and the grading gate fails on it (tests/test_course_notebooks.py).

It reads names, not objects: an exercise that mutates an object another reads, or writes a file another
opens, goes unseen. The day provides what an exercise needs from another in a cell of its own.
"""

from __future__ import annotations

import ast

import nbformat

from blank_probe import bound_in
from helpers.instructor import exercises

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _stored(node: ast.AST) -> set[str]:
    """Every name a node's subtree binds, arguments included (the locals of a function or comprehension)."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            found.add(child.id)
        elif isinstance(child, ast.arg):
            found.add(child.arg)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(child.name)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            found.update((alias.asname or alias.name).split(".")[0] for alias in child.names)
    return found


def _loaded(node: ast.AST, local: frozenset[str] = frozenset()) -> set[str]:
    """Names the subtree reads that are not its own functions', comprehensions' or loops' locals."""
    if isinstance(node, _FUNCTIONS + _COMPREHENSIONS):
        local = local | _stored(node)
    if isinstance(node, (ast.For, ast.AsyncFor)):  # the target is bound before the body reads it
        return _loaded(node.iter, local) | set().union(
            *(_loaded(child, local | _stored(node.target)) for child in node.body + node.orelse))
    found = set()
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
        found.add(node.id)
    for child in ast.iter_child_nodes(node):
        found |= _loaded(child, local)
    return found


# Methods that change the object they are called on: what they are given goes into it.
MUTATORS = {"append", "extend", "insert", "update", "add", "setdefault", "__setitem__"}


def _base(node: ast.AST) -> str | None:
    """The name an attribute or item chain hangs on: ``convs`` for ``convs[0]["flops"]``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def mutated(statement: ast.AST) -> set[str]:
    """Names whose objects a statement changes without binding them: an item or attribute stored into, a
    mutating method called, and a loop's iterable whose items the loop's body changes."""
    found = set()
    for node in ast.walk(statement):
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            found.add(_base(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            found.add(_base(node.func.value))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            changed = set().union(*(mutated(child) for child in node.body))
            if changed & _stored(node.target):
                found |= {_base(n) for n in ast.walk(node.iter) if isinstance(n, ast.Name)}
    return found - {None}


def _block_reads(body: list[ast.stmt], bound: set[str]) -> set[str]:
    """Names a block of statements reads before binding them, statement by statement, into the blocks of
    ``with``, ``for``, ``if``, ``while`` and ``try`` (what one branch binds, the other may not)."""
    free = set()
    for statement in body:
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            for item in statement.items:
                free |= _loaded(item.context_expr) - bound
                bound |= _stored(item.optional_vars) if item.optional_vars else set()
            free |= _block_reads(statement.body, bound)
        elif isinstance(statement, (ast.For, ast.AsyncFor)):
            free |= _loaded(statement.iter) - bound
            free |= _block_reads(statement.body, bound | _stored(statement.target)) | _block_reads(statement.orelse, set(bound))
        elif isinstance(statement, (ast.If, ast.While)):
            free |= _loaded(statement.test) - bound
            free |= _block_reads(statement.body, set(bound)) | _block_reads(statement.orelse, set(bound))
        elif isinstance(statement, ast.Try):
            free |= _block_reads(statement.body, set(bound)) | _block_reads(statement.finalbody, set(bound))
            for handler in statement.handlers:
                free |= _block_reads(handler.body, bound | ({handler.name} if handler.name else set()))
        else:
            free |= _loaded(statement) - bound
        bound |= bound_in([statement])
    return free


def statements(source: str) -> list[tuple[set[str], set[str], set[str]]]:
    """(names read, names bound, names changed) of each top-level statement of a cell: what it takes from
    the cells before it and what it leaves to the cells after it. A function's or class's body reads when
    it is called: everything the cell binds is there by then."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    everything = bound_in(tree.body)
    found, bound = [], set()
    for statement in tree.body:
        deferred = isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        binds = bound_in([statement])
        found.append((_block_reads([statement], set(bound)) - (everything if deferred else set()), binds,
                      set() if deferred else mutated(statement) - binds))
        bound |= binds
    return found


def handed_names(stub: str) -> set[str]:
    """Names the learner's version of a solution cell binds for certain: its imports, and what it binds before
    its first ``raise`` outside a function that holds one (a function left to write is the answer itself)."""
    try:
        tree = ast.parse(stub)
    except SyntaxError:
        return set()
    handed = set()
    for statement in tree.body:
        if isinstance(statement, ast.Raise):
            break
        if not any(isinstance(node, ast.Raise) for node in ast.walk(statement)):
            handed |= bound_in([statement])
    return handed


def dependencies(solution: nbformat.NotebookNode, student: nbformat.NotebookNode) -> list[str]:
    """Each solution or test cell of ``solution`` that reads a name coming from another exercise's answer (what
    a learner writes in ``student``'s solution cells), said as the cell, its exercise, the other exercise and
    the names."""
    stubs = {exercises.grader(c)["grade_id"]: c.source for c in student.cells
             if c.cell_type == "code" and exercises.grader(c).get("solution")}
    role = {}
    for ex in exercises.read(solution):
        for index in ex.cells:
            meta = exercises.grader(solution.cells[index])
            if solution.cells[index].cell_type == "code" and (meta.get("solution") or meta.get("grade")):
                role[index] = ex.number
    origin: dict[str, frozenset[int]] = {}
    found = []
    for index, cell in enumerate(solution.cells):
        if cell.cell_type != "code":
            continue
        meta, own = exercises.grader(cell), role.get(index)
        handed = handed_names(stubs.get(meta.get("grade_id"), "")) if meta.get("solution") else set()
        used: dict[str, frozenset[int]] = {}
        needs = frozenset()  # a statement runs only if every one before it in the cell ran
        for reads, binds, changes in statements(cell.source):
            used |= {name: origin[name] for name in reads if origin.get(name)}
            needs = needs.union(*used.values())
            for name in binds:
                origin[name] = needs if name in handed or not meta.get("solution") else needs | {own}
            for name in changes:  # a changed object keeps what it held and takes what went into it
                origin[name] = origin.get(name, frozenset()) | needs | ({own} if meta.get("solution") else set())
        for other in sorted(needs - {own}) if own is not None else []:
            names = sorted(name for name, sources in used.items() if other in sources)
            found.append(f"{meta['grade_id']} (exercise {own}) needs exercise {other}'s answer: {', '.join(names)}")
    return found
