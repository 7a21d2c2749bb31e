"""What a learner reads must speak to the learner: the rules `tests/test_prose.py` applies to the
student notebooks (and proves on planted examples).

A student notebook carries no notes about how the course was made (its test runs, its CI, the
runs "we made", dates of measurement, changelog phrasing), no formula the website cannot render,
no paragraph too long to hold (over ``MAX_WORDS``), one form of exercise heading whose points are
the points its test cells carry, and an opening that says what the day teaches and how long it takes.
"""

from __future__ import annotations

import re

from helpers.instructor.readme import stated_hours  # the README sums what the days state

MAX_WORDS = 150
GLOSSARY_LINK = "../GLOSSARY.md"

# Each class of text a learner should never read: (name, pattern, where: "markdown" or "all").
FORBIDDEN = [
    ("the course's CI", re.compile(r"\bCI\b|continuous integration"), "all"),
    ("the course's quick mode", re.compile(r"\bquick mode\b|TVM_COURSE_QUICK", re.I), "markdown"),
    ("notes about how the course was made", re.compile(
        r"\bwe (?:made|ran|measured|tried|found|tuned|recorded|changed|added|removed)\b|\bruns? of this solution\b"
        r"|\bnotes of this course\b|\bcourse's (?:own )?notes\b|\bsource post\b|\bthe team\b|(?<![./])\bmaintainers?\b"
        r"|\b(?:stop|issue) \d+\b|\bin every run\b", re.I), "all"),
    ("a date of measurement", re.compile(
        r"\b20\d\d-\d\d-\d\d\b|\b(?:January|February|March|April|May|June|July|August|September|October|November"
        r"|December) 20\d\d\b|\bmeasured (?:on|in) 20\d\d\b"), "all"),
    ("changelog phrasing", re.compile(
        r"\bno longer\b|\bpreviously\b|\buntil [^.]{0,80}\bgot\b|\bhas been (?:added|removed|changed|fixed)\b"
        r"|\bused to be\b|\bthe (?:old|earlier) version of this (?:course|notebook|day)\b", re.I), "markdown"),
    ("a formula in dollar signs (the website renders no math)", re.compile(r"\$\$|(?<![\\\w])\$[^$\n]+\$"), "markdown"),
]

EXERCISE = re.compile(r"^### Exercise (\d+) \((\d+) points?(, graded by your instructor)?\): \S.*$")
EXERCISE_LIKE = re.compile(r"^(?:#+\s*|\*\*)(?:Exercise|Live check)\b", re.I)
HEADING = re.compile(r"^(#{1,3}) ")


def _without_code(markdown: str) -> str:
    """Markdown without fenced blocks and inline code, where names and commands may say anything."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return re.sub(r"`[^`\n]*`", "`code`", text)


def paragraphs(markdown: str) -> list[str]:
    """The paragraphs of a markdown cell: blocks between blank lines, each list item one, tables left out."""
    found = []
    for block in re.split(r"\n\s*\n", re.sub(r"```.*?```", "", markdown, flags=re.S)):
        if block.lstrip().startswith("|"):
            continue
        found.extend(p for p in re.split(r"\n(?=\s*(?:[-*]|\d+\.)\s)", block) if p.strip())
    return found


def problems_in_text(text: str, cell_type: str) -> list[str]:
    """Every rule a cell's text breaks, each as a short message quoting what broke it."""
    found = []
    plain = _without_code(text) if cell_type == "markdown" else text
    for name, pattern, where in FORBIDDEN:
        if where == "markdown" and cell_type != "markdown":
            continue
        for match in pattern.finditer(text if name.startswith("a formula") else plain):
            start = max(0, match.start() - 40)
            found.append(f"{name}: ...{plain[start:match.end() + 40]!r}..." if not name.startswith("a formula")
                         else f"{name}: {match.group(0)[:60]!r}")
    if cell_type == "markdown":
        for para in paragraphs(text):
            words = len(para.split())
            if words > MAX_WORDS:
                found.append(f"a paragraph of {words} words (at most {MAX_WORDS}): {para[:70]!r}...")
    return found


def _grader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def exercise_problems(cells: list) -> list[str]:
    """Exercise headings in one form, numbered in order, each announcing the points of its test cells;
    every graded cell inside an exercise."""
    found, number, current, points, solutions = [], 0, None, 0.0, 0

    def close():
        if current is not None and points != current[1]:
            found.append(f"Exercise {current[0]} announces {current[1]} points, its test cells carry {points:g}")
        if current is not None and points and not solutions:
            found.append(f"Exercise {current[0]} has test cells but no solution cell of its own")

    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "markdown":
            for line in source.splitlines():
                match = EXERCISE.match(line)
                if match:
                    close()
                    number += 1
                    if int(match.group(1)) != number:
                        found.append(f"exercise numbered {match.group(1)} where {number} comes next")
                    current, points, solutions = (int(match.group(1)), int(match.group(2))), 0.0, 0
                elif EXERCISE_LIKE.match(line):
                    found.append(f"an exercise heading not in the form '### Exercise N (P points): title': {line[:80]!r}")
                elif HEADING.match(line) and current is not None:
                    close()
                    current = None
        grader = _grader(cell)
        if grader.get("solution") and current is not None:
            solutions += 1
        if grader.get("grade"):
            if current is None:
                found.append(f"graded cell {grader.get('grade_id')} is under no exercise heading")
            else:
                points += float(grader.get("points", 0))
    close()
    return found


def opening_problems(first_cell_source: str) -> list[str]:
    """A day opens with its title, what the learner will be able to do (3-5 items), its time, the glossary."""
    found = []
    if not re.match(r"# Day \d+ — \S", first_cell_source):
        found.append("the first cell does not start with '# Day N — title'")
    goals = re.search(r"\*\*You will be able to\*\*\n((?:\s*(?:\d+\.|-) .*\n?(?: {2,}.*\n?)*)+)", first_cell_source)
    items = len(re.findall(r"^\s*(?:\d+\.|-) ", goals.group(1), re.M)) if goals else 0
    if not 3 <= items <= 5:
        found.append(f"'**You will be able to**' with 3 to 5 items is missing (found {items})")
    if stated_hours(first_cell_source) is None:
        found.append("a line '**Time:** about N hours ...' is missing")
    if GLOSSARY_LINK not in first_cell_source:
        found.append(f"no link to the glossary ({GLOSSARY_LINK})")
    return found
