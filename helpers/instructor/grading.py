"""The instructor's nbgrader pipeline: generate, submit, autograde, read scores.

Each step runs the real ``nbgrader`` command on a course directory (the repo,
or a scratch copy in tests) with its real sqlite gradebook.

    python -m helpers.instructor.grading generate [DAY]            # solutions/ -> notebooks/
    python -m helpers.instructor.grading submit DAY STUDENT FILE   # place a student's notebook
    python -m helpers.instructor.grading autograde DAY             # grade submitted/*/DAY
    python -m helpers.instructor.grading scores DAY                # print each student's score
    python -m helpers.instructor.grading feedback DAY              # feedback/<student>/DAY/*.html
    python -m helpers.instructor.grade_table report DAY / export [grades.csv]   # scores and problems / every grade

Every command works on a fresh clone, where the student notebooks are committed but the
gradebook (kept out of git) does not exist yet: autograde first records the day in the
gradebook from its source, as ``generate`` would, without rewriting notebooks/. A command that
cannot run yet (feedback before autograde, say) says in one line what to run first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import config
from ..errors import GradingError
from . import nbgrader_command, stops

REPO = config.REPO
SOURCE = "solutions"
RELEASE = "notebooks"
GRADEBOOK = "gradebook.db"


def assignments(course: Path = REPO) -> list[str]:
    """Assignment names: the folders of solutions/ that hold a notebook of the same name."""
    root = course / SOURCE
    return sorted(p.name for p in root.iterdir() if (p / f"{p.name}.ipynb").exists())


def _env() -> dict[str, str]:
    # nbgrader runs `alembic` to create a gradebook: the environment's bin must be on PATH.
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def nbgrader(*args: str, course: Path = REPO, check: bool = True,
             on_log_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess:
    """Run ``nbgrader ARGS`` in the course directory, with the course's config (in a process of its own,
    forked from one that has nbgrader imported: ``nbgrader_command``); ``on_log_line`` sees its log as it comes."""
    proc = nbgrader_command.run(list(args), course, _env(), on_log_line)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`nbgrader {' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def scratch_course(dest: Path, names: list[str] | None = None, origin: Path = REPO) -> Path:
    """A copy of the course ``origin`` (config and sources) in ``dest``, for tests and dry runs."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(origin / "nbgrader_config.py", dest / "nbgrader_config.py")
    for name in names or assignments(origin):
        shutil.copytree(origin / SOURCE / name, dest / SOURCE / name, dirs_exist_ok=True)
    return dest


def gradebook_url(course: Path) -> str:
    """The course's sqlite gradebook as nbgrader's Gradebook and --db take it."""
    return f"sqlite:///{(course / GRADEBOOK).resolve()}"


def _check_assignment(assignment: str, course: Path) -> None:
    known = assignments(course)
    if assignment not in known:
        raise GradingError(f"There is no day {assignment!r}: the days are the folders of {SOURCE}/ ({', '.join(known)}).")


def in_gradebook(assignment: str, course: Path = REPO) -> bool:
    """Whether the gradebook holds ``assignment`` with its notebooks (what generate_assignment records)."""
    if not (course / GRADEBOOK).exists():
        return False  # (opening a missing gradebook would create it)
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(gradebook_url(course)) as gb:
        try:
            return len(gb.find_assignment(assignment).notebooks) > 0
        except MissingEntry:
            return False


def register(assignment: str, course: Path = REPO) -> None:
    """Record ``assignment`` in the course's gradebook from its source, leaving notebooks/ as it is.

    nbgrader grades against what generate_assignment recorded (graded cells, points, hidden
    tests). A fresh clone has the student notebooks but no gradebook: generating in a scratch
    copy of the course, into this course's gradebook, records the day without rewriting them.
    """
    _check_assignment(assignment, course)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = scratch_course(Path(tmp), [assignment], origin=course)
        nbgrader("generate_assignment", assignment, "--force", f"--db={gradebook_url(course)}", course=scratch)


def generate(name: str | None = None, course: Path = REPO) -> None:
    """Write the student version(s) into notebooks/ from solutions/."""
    if name:
        _check_assignment(name, course)
        nbgrader("generate_assignment", name, "--force", course=course)
        return
    days = assignments(course)
    if sorted(p.name for p in (course / SOURCE).iterdir() if p.is_dir()) == days:
        # Every day in one nbgrader process (its glob): the same notebooks and gradebook as one run per
        # day, in a sixth of the time (each run starts nbgrader and opens the gradebook anew).
        nbgrader("generate_assignment", "*", "--force", course=course)
        return
    for assignment in days:  # a folder that is no day: name each day, so that it is not released
        nbgrader("generate_assignment", assignment, "--force", course=course)


def submit(course: Path, assignment: str, student: str, notebook: Path) -> Path:
    """Place ``notebook`` as ``student``'s submission (what `nbgrader collect` would do)."""
    _check_assignment(assignment, course)
    if not Path(notebook).is_file():
        raise GradingError(f"No notebook at {notebook}: give the student's .ipynb file (NB=path/to/file.ipynb).")
    dest = course / "submitted" / student / assignment
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"{assignment}.ipynb"
    shutil.copy(notebook, target)
    return target


def autograde(assignment: str, course: Path = REPO, student: str | None = None,
              cell_timeout: int | None = None, progress: Callable[[str], None] | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    """Execute and grade the submissions; hidden and edited tests come back from the gradebook.

    ``cell_timeout`` (seconds) overrides the course's per-cell limit (nbgrader_config.py): a
    cell that runs longer, an infinite loop say, is interrupted and costs only its own points.
    ``progress`` is given a line as each student's notebook starts and each graded cell runs.
    Returns nbgrader's run, its log (stderr) included.
    """
    _check_assignment(assignment, course)
    submitted = sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}") if p.is_dir())
    if not submitted or (student and student not in submitted):
        who = f"of {student} " if student else ""
        raise GradingError(f"No submission {who}for {assignment} in submitted/: place each one first with "
                           f"`make submit DAY={assignment} STUDENT=<name> NB=<notebook>`.")
    if not in_gradebook(assignment, course):
        register(assignment, course)
        print(f"{assignment} was not in the gradebook yet: recorded it from {SOURCE}/{assignment} (as `make student` does).")
    extra = ["--student", student] if student else []
    if cell_timeout is not None:
        extra.append(f"--Execute.timeout={cell_timeout}")
    return nbgrader("autograde", assignment, "--force", *extra, course=course, check=check,
                    on_log_line=progress and _progress_lines(progress))


def _progress_lines(show: Callable[[str], None]) -> Callable[[str], None]:
    """nbgrader's log lines a grader wants to see as they come: each student started, each graded cell
    (stops.PROGRESS), each problem."""
    def line(text: str) -> None:
        message = text.split("] ", 1)[-1]
        if message.startswith(stops.PROGRESS) or "Autograding" in message or "| ERROR]" in text:
            show(message.removeprefix(stops.PROGRESS))
    return line


def feedback(assignment: str, course: Path = REPO, allow_ungraded: bool = False) -> list[Path]:
    """HTML feedback for every autograded submission: feedback/<student>/<assignment>/<nb>.html.

    A written answer nobody has graded yet would read "0 points" in it: refused, naming the students,
    unless ``allow_ungraded`` (the autograded part returned early, the written part said to be pending)."""
    _check_assignment(assignment, course)
    if not any((course / "autograded").glob(f"*/{assignment}")):
        raise GradingError(f"No autograded submission of {assignment} yet: run `make autograde DAY={assignment}` first.")
    waiting = [] if allow_ungraded else ungraded(assignment, course)
    if waiting:
        raise GradingError(f"The written answers of {', '.join(waiting)} are not graded yet: their feedback would say 0 "
                           "points. Grade them in the Formgrader (docs/instructors.md, 'Written answers'), or make the "
                           f"feedback anyway with `make feedback DAY={assignment} ALLOW_UNGRADED=1`.")
    nbgrader("generate_feedback", assignment, "--force", course=course)
    return sorted((course / "feedback").glob(f"*/{assignment}/*.html"))


@dataclass(frozen=True)
class Score:
    """Autograded points (code cells); written answers wait for an instructor and are not counted."""

    student: str
    score: float
    max_score: float


def scores(assignment: str, course: Path = REPO) -> dict[str, Score]:
    """Each student's autograded score for ``assignment``, read from the gradebook."""
    if not in_gradebook(assignment, course):
        _check_assignment(assignment, course)
        raise GradingError(f"Nothing graded for {assignment} yet: run `make autograde DAY={assignment}` first.")
    from nbgrader.api import Gradebook

    with Gradebook(gradebook_url(course)) as gb:
        result = {}
        for sub in gb.assignment_submissions(assignment):
            result[sub.student_id] = Score(sub.student_id, float(sub.code_score), float(sub.max_code_score))
        return result


def ungraded(assignment: str, course: Path = REPO) -> list[str]:
    """The students whose submission of ``assignment`` still has a written answer to grade by hand (a test cell
    the learner deleted also waits for a look in nbgrader's eyes, but it scores 0 whatever: not counted)."""
    from nbgrader.api import Gradebook  # (seconds to import: only where the gradebook is read)

    with Gradebook(gradebook_url(course)) as gb:
        return sorted(sub.student_id for sub in gb.assignment_submissions(assignment)
                      if any(g.needs_manual_grade and g.cell_type == "markdown" for nb in sub.notebooks for g in nb.grades))


def cell_scores(assignment: str, student: str, course: Path = REPO) -> dict[str, float]:
    """Points per graded cell (by grade_id) of one student's autograded submission."""
    from nbgrader.api import Gradebook

    with Gradebook(gradebook_url(course)) as gb:
        sub = gb.find_submission(assignment, student)
        return {g.name: float(g.score) for nb in sub.notebooks for g in nb.grades}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.instructor.grading", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("generate").add_argument("assignment", nargs="?", help="one day (3, 03, day03 or day03_build); none: every day")
    submit_cmd = sub.add_parser("submit")
    for arg in ("assignment", "student", "notebook"):
        submit_cmd.add_argument(arg)
    for name in ("autograde", "scores", "feedback"):
        sub.add_parser(name).add_argument("assignment")
    sub.choices["autograde"].add_argument("--student", help="grade this student only (the others keep their grades)")
    sub.choices["feedback"].add_argument("--allow-ungraded", action="store_true",
                                         help="make feedback though written answers wait to be graded")
    args = parser.parse_args(argv)
    try:
        _run(args)
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _run(args) -> None:
    if args.command == "generate":
        from .days import day_name  # (here: the one command of this module that reads a day as typed, make student DAY=3)

        generate(day_name(args.assignment, assignments(REPO), "make student") if args.assignment else None, REPO)
    elif args.command == "submit":
        print(submit(REPO, args.assignment, args.student, Path(args.notebook)))
    elif args.command == "autograde":  # the scores and problems follow: python -m helpers.instructor.grade_table report
        proc = autograde(args.assignment, student=args.student, progress=lambda line: print(line, flush=True), check=False)
        if proc.returncode != 0:
            print(f"nbgrader autograde ended with status {proc.returncode}: the report says which students it could not "
                  f"grade. Its log's end:\n{proc.stderr[-1500:]}")
    elif args.command == "feedback":
        for path in feedback(args.assignment, allow_ungraded=args.allow_ungraded):
            print(path)
    else:
        for s in scores(args.assignment).values():
            print(f"{s.student}: {s.score:g} / {s.max_score:g}")


if __name__ == "__main__":
    sys.exit(main())
