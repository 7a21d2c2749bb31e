"""Finds a visible test that holds the answer it grades: a function in a test cell that a learner can see whose code
covers most of the exercise's solution, which ``return that_function(...)`` would then pass (Day 12's
``reference_error`` was one, a solution written again with other names).

The solution and each function are compared as Python tokens, names kept (the calls and attributes carry the
idea); the share of the solution's tokens that the function holds in the same order (``difflib``'s matching
blocks) is its coverage. Measured on the course when this check was written: the one copy found, 0.89; every other
visible function 0.49 or less, helpers that build inputs and check outputs. Solutions under ``MIN_TOKENS`` (a line
or two, such as a class's name) are too short to say anything; a cell with several solution blocks (a class's
methods) is compared block by block.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize

from helpers.instructor.feedback_hidden import HIDDEN_REGION

SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
COVERAGE = 0.7
MIN_TOKENS = 30


def tokens(code: str) -> list[str]:
    """Names, operators and numbers, in order (strings, comments and layout left out)."""
    found = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
                found.append(token.string)
    except (tokenize.TokenError, IndentationError):
        pass
    return found


def functions(code: str) -> list[tuple[str, str]]:
    """(name, source) of every function ``code`` defines, nested ones included."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [(node.name, ast.get_source_segment(code, node)) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def coverage(solution: list[str], other: list[str]) -> float:
    """The share of ``solution``'s tokens that ``other`` holds in the same order."""
    matcher = difflib.SequenceMatcher(None, solution, other, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / max(len(solution), 1)


def copies(nb) -> list[str]:
    """Each visible test function of ``nb`` (a source notebook) that holds its exercise's solution, said in a line."""
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    found = []
    for exercise, cell in cells.items():
        if not (exercise and cell.metadata["nbgrader"].get("solution")):
            continue
        solutions = [part for part in map(tokens, SOLUTION.findall(cell.source)) if len(part) >= MIN_TOKENS]
        for test, test_cell in cells.items():
            if not (test and test.startswith("test_") and exercise in test and test_cell.metadata["nbgrader"].get("grade")):
                continue
            for name, source in functions(HIDDEN_REGION.sub("", test_cell.source)):
                share = max((coverage(solution, tokens(source)) for solution in solutions), default=0.0)
                if share >= COVERAGE:
                    found.append(f"{test}: its visible function {name}() holds {share:.0%} of the solution of "
                                 f"{exercise}; a learner can return {name}(...) and pass. Move it to the hidden tests, "
                                 "or check stored values and properties instead")
    return found
