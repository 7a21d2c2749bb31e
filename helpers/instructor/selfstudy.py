"""The self-study learner's two commands: `make lab`'s work folder and `make check`'s grading.

``work/`` (git ignores it) holds the learner's own copies of the student notebooks, copied from
``notebooks/`` the first time each day is missing and never overwritten, so that doing the
exercises touches no file of the course and ``make test`` keeps passing. ``make check DAY=3``
grades the learner's copy with nbgrader's autograde, visible and hidden tests, in a scratch
course of its own: it prints the points of each exercise and each failing test's message, and
never modifies the learner's file.

    python -m helpers.instructor.selfstudy fill           # make lab: copy what work/ lacks
    python -m helpers.instructor.selfstudy check 3        # make check DAY=3
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..errors import GradingError
from . import days, exercises, grading
from .feedback_hidden import hidden_lines, hide

WORK = "work"
STUDENT = "you"


def fill(course: Path = grading.REPO, work: Path | None = None) -> list[Path]:
    """Copy into ``work`` every file of ``notebooks/`` it lacks; never overwrite one. Returns what was copied."""
    release = course / grading.RELEASE
    work = Path(work) if work is not None else course / WORK
    copied = []
    for path in sorted(p for p in release.rglob("*") if p.is_file() and ".ipynb_checkpoints" not in p.parts):
        dest = work / path.relative_to(release)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            copied.append(dest)
    return copied


def day_name(day: str, course: Path = grading.REPO) -> str:
    """The day's folder name from what a learner types: ``3``, ``03``, ``day03`` or ``day03_build``."""
    known = grading.assignments(course) if (course / grading.SOURCE).is_dir() else \
        sorted(p.name for p in (course / grading.RELEASE).iterdir() if p.is_dir())
    return days.day_name(day, known)


@dataclass(frozen=True)
class TestResult:
    grade_id: str
    exercise: str
    points: float
    max_points: float
    message: str   # the failing test's error (empty when it passed)


def _failure(cell) -> str:
    """A failing test cell's message, as the learner's feedback shows it: the error's last line, or what
    it wrote to stderr; a line of the cell's hidden tests in it (a warning prints the line that raised
    it) shows a mark instead, as in the feedback (``feedback_hidden.hide``)."""
    hidden = hidden_lines(cell.source)
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            value = hide(str(out.get("evalue", "")), hidden).strip()
            return f"{out.get('ename', 'Error')}: {value}" if value else out.get("ename", "Error")
    for out in cell.get("outputs", []):
        if out.get("name") == "stderr":
            text = hide("".join(out.get("text", "")), hidden).strip()
            return "wrote to stderr (the grader counts that as a failure): " + text[:300]
    return ""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check(day: str, course: Path = grading.REPO, work: Path | None = None, cell_timeout: int | None = None,
          log=print) -> list[TestResult]:
    """Grade the learner's copy of ``day`` with the visible and hidden tests; the copy is left as it was."""
    name = day_name(day, course)
    work = Path(work) if work is not None else course / WORK
    mine = work / name / f"{name}.ipynb"
    if not mine.is_file():
        raise GradingError(f"There is no {mine.relative_to(course) if mine.is_relative_to(course) else mine}: "
                           "run `make lab` once, it copies the course's notebooks into work/, where you do the exercises.")
    source = course / grading.SOURCE / name / f"{name}.ipynb"
    if not source.is_file():
        raise GradingError(f"This copy of the course has no {grading.SOURCE}/ (a class handout): its hidden tests are "
                           "with your instructor, who grades your work. Run the test cells in the notebook to check it.")
    try:
        nbformat.validate(nbformat.read(mine, as_version=4))
    except (ValueError, nbformat.ValidationError, KeyError, AttributeError, TypeError) as err:  # NotJSONError is a ValueError
        raise GradingError(f"{mine} is not a notebook that can be read ({type(err).__name__}: {str(err)[:200]}). "
                           f"Rename it, run `make lab` for a fresh copy, and bring your answers over.") from None
    before = _digest(mine)
    with tempfile.TemporaryDirectory(prefix="check-") as tmp:
        scratch = grading.scratch_course(Path(tmp) / "course", [name], origin=course)
        grading.register(name, scratch)
        submitted = scratch / "submitted" / STUDENT / name
        shutil.copytree(mine.parent, submitted, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        log(f"Grading {name}: running your notebook from top to bottom with the visible and hidden tests ...")
        started = time.perf_counter()
        grading.autograde(name, scratch, student=STUDENT, cell_timeout=cell_timeout)
        log(f"(ran in {time.perf_counter() - started:.0f} s)")
        scores = grading.cell_scores(name, STUDENT, scratch)
        graded = nbformat.read(scratch / "autograded" / STUDENT / name / f"{name}.ipynb", as_version=4)
    if _digest(mine) != before:  # pragma: no cover - the grading above works on a copy
        raise GradingError(f"{mine} changed while it was graded: this is a bug in the course, please report it.")
    reference = nbformat.read(source, as_version=4)
    owners = exercises.by_test(exercises.read(reference))
    points = {exercises.grader(c)["grade_id"]: float(exercises.grader(c).get("points", 0))
              for c in reference.cells if exercises.grader(c).get("grade") and c.cell_type == "code"}
    cells = {exercises.grader(c).get("grade_id"): c for c in graded.cells if exercises.grader(c).get("grade")}
    results = []
    for grade_id, max_points in points.items():
        got = scores.get(grade_id, 0.0)
        message = _failure(cells[grade_id]) if grade_id in cells else "the test cell is missing from your notebook"
        exercise = owners[grade_id].label if grade_id in owners else grade_id
        results.append(TestResult(grade_id, exercise, got, max_points, "" if got == max_points else message))
    return results


def report(name: str, results: list[TestResult], course: Path = grading.REPO, work: Path = Path("work")) -> str:
    """What `make check` prints: the total, then each exercise's tests with points and failures (``work``:
    the learner's folder, named as they gave it)."""
    total, most = sum(r.points for r in results), sum(r.max_points for r in results)
    lines = [f"{name}: {total:g} / {most:g} points"]
    for result in results:
        mark = "ok  " if result.points == result.max_points else "FAIL"
        lines.append(f"  {mark} {result.exercise} [{result.grade_id}]: {result.points:g} / {result.max_points:g}")
        if result.message:
            lines.append(f"       {result.message[:400]}")
    source = nbformat.read(course / grading.SOURCE / name / f"{name}.ipynb", as_version=4)
    for ex in exercises.read(source):
        if ex.manual:
            lines.append(f"  ---- {ex.label}: a written answer ({ex.points} points), graded by an instructor, not here")
    lines.append(f"Your notebook in {work}/ was not modified.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.instructor.selfstudy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fill_cmd = sub.add_parser("fill", help="copy into work/ the notebooks it lacks (make lab)")
    fill_cmd.add_argument("--into", default=WORK, help="the folder of your copies (default: work)")
    check_cmd = sub.add_parser("check", help="grade your copy of a day (make check DAY=3)")
    check_cmd.add_argument("day")
    check_cmd.add_argument("--work", default=WORK, help="the folder of your copies (default: work)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fill":
            into = Path(args.into)
            copied = fill(work=into)
            days = sorted({p.relative_to(into).parts[0] for p in copied if p.suffix == ".ipynb"})
            print(f"{into}/: your copies of {', '.join(days)} were added" if days
                  else f"{into}/: your copies are all there (nothing was overwritten)")
        else:
            name = day_name(args.day)
            print(report(name, check(name, work=Path(args.work)), work=Path(args.work)))
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
