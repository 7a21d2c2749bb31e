"""Feedback that keeps the hidden tests hidden, in the outputs too: every feedback the course makes.

nbgrader's feedback shows each autograded cell as graded, hidden tests included (its default
``GenerateFeedback.preprocessors`` clears nothing). ``ClearHiddenTests`` removes them from a cell's
source, but a failing test's traceback prints the lines around the one that failed, hidden tests
included. ``HideHiddenTestsInOutputs`` runs first and replaces every such line in the outputs with a
mark; the failing test's message, which says what was expected, stays. ``FEEDBACK_PREPROCESSORS`` is
what the course's ``nbgrader_config.py`` sets (``make feedback``, and the hub's course directory,
whose config is a copy of it); ``make check`` hides the same lines in the messages it prints.
``hidden_test_lines`` and ``shown`` are how the tests look for a leak (feedback, the handout).
"""

from __future__ import annotations

import html
import re
from functools import lru_cache

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import ClearHiddenTests, GetGrades, NbGraderPreprocessor

from .site import _REGION, _TAG, json_escape

HIDDEN_REGION = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MARK = "(a hidden test)"
# Shorter lines (``else:``, ``for _ in range(3):``) turn up anywhere; they give nothing away.
SHORTEST = 20


def hidden_lines(source: str) -> set[str]:
    """The stripped, non-empty lines of a cell's hidden-test regions."""
    return {line.strip() for region in HIDDEN_REGION.findall(source) for line in region.splitlines() if line.strip()}


def hidden_test_lines(*sources) -> set[str]:
    """The lines of the hidden tests of the instructor's ``sources`` (notebooks) that a learner never
    sees: stripped, ``SHORTEST`` characters or more, and in no visible part of any of them (what
    the student version shows is no secret)."""
    hidden, visible = set(), []
    for nb in sources:
        for cell in nb.cells:
            hidden |= hidden_lines(cell.source)
            visible.append(_REGION.sub("", cell.source))  # what the student version shows
    visible = "\n".join(visible)
    return {line for line in hidden if len(line) >= SHORTEST and line not in visible}


WORD = re.compile(r"\w+")


@lru_cache(maxsize=None)
def _inner_words(form: str) -> frozenset[str]:
    """The words of ``form`` with a non-word character on both sides inside it: wherever ``form`` occurs in a
    text, each of them is a whole word of that text too."""
    return frozenset(m.group() for m in WORD.finditer(form) if 0 < m.start() and m.end() < len(form))


def shown(text: str, lines: set[str]) -> list[str]:
    """Which of ``lines`` ``text`` shows: as it is, inside a notebook's JSON (escaped), or in HTML (tags
    removed, entities unescaped: a line split into highlighting spans is still found). A line is searched for
    only in a text holding all its inner words (``_inner_words``), which makes the search fast and misses nothing."""
    texts = [text, html.unescape(_TAG.sub("", text))] if "<" in text else [text]
    found = set()
    for t in texts:
        words = set(WORD.findall(t))
        found |= {line for line in lines - found for form in {line, json_escape(line)}
                  if _inner_words(form) <= words and form in t}
    return sorted(found)


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


# nbgrader's feedback, less the hidden tests: their code (ClearHiddenTests) and where a traceback shows it
# (HideHiddenTestsInOutputs, first, while the cell's source still holds them); then nbgrader's own two.
FEEDBACK_PREPROCESSORS = [HideHiddenTestsInOutputs, ClearHiddenTests, GetGrades, CSSHTMLHeaderPreprocessor]
