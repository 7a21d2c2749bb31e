"""Feedback that keeps the hidden tests hidden, in the outputs too (nbgrader's feedback, on the hub).

nbgrader's ``ClearHiddenTests`` removes the hidden tests from a cell's source, but a failing test's
traceback prints the lines around the one that failed, and where that line is near the hidden
tests (the last visible assertion) the traceback shows their code. ``HideHiddenTestsInOutputs``
runs first and replaces every such line in the outputs with a mark; the failing test's message,
which says what was expected, stays.
"""

from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor

HIDDEN_REGION = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MARK = "(a hidden test)"


def hidden_lines(source: str) -> set[str]:
    """The stripped, non-empty lines of a cell's hidden-test regions."""
    return {line.strip() for region in HIDDEN_REGION.findall(source) for line in region.splitlines() if line.strip()}


def hide(text: str, hidden: set[str]) -> str:
    """``text`` with each line that shows a hidden line (after its traceback line number, colours aside)
    replaced by the number and ``MARK``."""
    out = []
    for line in text.split("\n"):
        plain = ANSI.sub("", line)
        code = re.sub(r"^\s*(?:-*>\s*)?\d+\s", "", plain).strip()
        if code and code in hidden:
            number = re.match(r"^\s*(?:-*>\s*)?\d*", plain).group(0)
            line = f"{number} {MARK}"
        out.append(line)
    return "\n".join(out)


class HideHiddenTestsInOutputs(NbGraderPreprocessor):
    """Replace the lines of a cell's hidden tests wherever its outputs (a traceback's context) show them."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code":
            hidden = hidden_lines(cell.source)
            if hidden:
                for output in cell.get("outputs", []):
                    if "traceback" in output:
                        output["traceback"] = [hide(entry, hidden) for entry in output["traceback"]]
                    if "text" in output:
                        output["text"] = hide(output["text"], hidden)
        return cell, resources
