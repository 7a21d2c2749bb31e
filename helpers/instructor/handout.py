"""`make handout`: the course as a class gets it, without the solutions and the hidden tests.

A clone of the repository holds ``solutions/`` (every answer and hidden test) and ``tests/`` (which
read them). The handout is every file git keeps, less those two folders and the CI script, packed
as ``build/handout/tvm-course-handout.tar.gz``; it is refused if a file a learner reads holds a line
of a solution or hidden test (the website's check, ``site.leaks``), or any file a line of a hidden
test (see ``given_away``). ``make handout DAY=3`` packs one day's notebook with all the rest
(``tvm-course-handout-day03_build.tar.gz``), for a class released a day at a time.

Its README is the repository's with what is not true of a handout rewritten (``readme``): no ``make
test`` (no ``tests/``), no ``make check`` with hidden tests, no solutions to be honest about; in a
day's handout, that day alone in the list of days.

    python -m helpers.instructor.handout          # every day
    python -m helpers.instructor.handout 3        # Day 3 only (3, 03, day03 or day03_build)
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import nbformat

from ..errors import GradingError
from .days import day_name
from .feedback_hidden import hidden_test_lines, shown
from .grading import RELEASE, REPO, SOURCE, assignments
from .readme import BLOCK
from .site import _readable, leaks

LEFT_OUT = (f"{SOURCE}/", "tests/", ".ci/")
NAME = "tvm-course-handout"


def files(course: Path = REPO, day: str | None = None) -> list[str]:
    """What the handout holds: the files git keeps (tracked, or new and not ignored), less ``LEFT_OUT``; with a
    ``day``, less the other days' folders of ``notebooks/`` (the glossary, helpers, results and the rest stay)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=course,
                         capture_output=True, text=True, check=True).stdout
    others = tuple(f"{RELEASE}/{other}/" for other in assignments(course) if day and other != day)
    return sorted(name for name in out.splitlines()
                  if not name.startswith(LEFT_OUT + others) and (course / name).is_file())


# What README.md says that is not true of a handout, and what the handout's README says instead: (what, then
# the text as it stands, then the handout's). The text must be found, or the handout is refused: README.md
# changed, and this must follow it.
REWRITES = [
    ("make test, which needs tests/", "## Two commands\n\n```bash\nmake lab     # sets up the environment if needed, then "
     "opens your copies of the notebooks in JupyterLab\nmake test    # sets up the environment if needed, then runs the "
     "course's whole test suite\n```",
     "## One command\n\n```bash\nmake lab     # sets up the environment if needed, then opens your copies of the "
     "notebooks in JupyterLab\n```"),
    ("make check, which needs the hidden tests", "3. Grade your work as an instructor would, with the hidden tests too:\n\n"
     "   ```bash\n   make check DAY=3    # points per exercise and each failing test's message; your file is not changed\n"
     "   ```",
     "3. Hand in your notebook (`{notebook}`) as your instructor asks: they grade it with the visible\n"
     "   tests and with hidden ones, which this handout does not hold."),
    ("the solutions, which a handout lacks", "This repository holds the solutions (`solutions/`) and the hidden tests: "
     "self-study is on your\nhonour. A class gets a handout without them ([docs/instructors.md](docs/instructors.md)). "
     "The terms\nthe course uses are in the [glossary](notebooks/GLOSSARY.md).",
     "This is a class's handout: it holds neither the solutions nor the hidden tests, which stay with your\n"
     "instructor. The terms the course uses are in the [glossary](notebooks/GLOSSARY.md)."),
    ("the maintainers' guide, to tests a handout lacks", "- [docs/maintainers.md](docs/maintainers.md): the tests, the "
     "tuning databases, the benchmark and the website.\n", ""),
]
# ... and in a handout of one day, Day 0's notebook, which it lacks.
DAY_REWRITES = [
    ("Day 0's notebook", "Open `work/day00_environment/day00_environment.ipynb` first: it checks\n   the environment "
     "and tells you what to fix.", "Open `work/{day}/{day}.ipynb`."),
]


def readme(text: str, day: str | None = None) -> str:
    """README.md as a learner holding the handout reads it: ``REWRITES`` made; with a ``day``, that day alone in the
    list of days and its time in place of the course's."""
    for what, old, new in REWRITES + (DAY_REWRITES if day and day != assignments()[0] else []):
        if old not in text:
            raise GradingError(f"README.md no longer says what the handout rewrites ({what}): update "
                               "helpers/instructor/handout.py's REWRITES to the README's new text.")
        text = text.replace(old, new.format(day=day, notebook=f"work/{day}/{day}.ipynb" if day else "work/dayNN_*/dayNN_*.ipynb"))
    if day:
        table = next(m for m in BLOCK.finditer(text) if m.group(2) == "days").group(0)
        row = next(line for line in table.splitlines() if f"]({RELEASE}/{day}/" in line)
        text = text.replace(table, "\n".join([line for line in table.splitlines() if not line.startswith("| ") or
                                              line.startswith(("| day ", "| ---")) or line == row]))
        time = row.rstrip(" |").rsplit("| ", 1)[1]
        text = re.sub(r"<!-- total:begin -->.*?<!-- total:end --> \(the days are listed below\)",
                      f"{time}, the one day this handout holds (below)", text)
    return text


# What a learner reads in a handout; the rest is the course's library (helpers/, whose code may share a line
# with an answer, such as ``torch.manual_seed(seed)``) and data (tuning/'s databases).
READ = ("notebooks", "docs", "results", "README.md")


# Lines of a hidden test that the library holds too, as its own code (helpers/quantize.py; Day 4's test): no secret.
LIBRARY_LINES = {'main = imported.mod["main"]'}


def given_away(folder: Path) -> list[str]:
    """What in an unpacked handout gives an answer away: every solution or hidden-test line and nbgrader
    marker found in the files a learner reads (``READ``), and every hidden-test line in any other file."""
    folder = Path(folder)
    read = [p for name in READ for p in ([folder / name] if (folder / name).is_file() else (folder / name).rglob("*"))
            if p.is_file()]
    found = leaks(folder, files=read)
    hidden = hidden_test_lines(*(nbformat.read(REPO / SOURCE / day / f"{day}.ipynb", as_version=4)
                                 for day in assignments())) - LIBRARY_LINES
    for path in sorted(set(folder.rglob("*")) - set(read)):
        text = _readable(path) if path.is_file() else None
        found += [f"{path.relative_to(folder)}: a line of a hidden test: {line!r}" for line in shown(text or "", hidden)]
    return found


def build(course: Path = REPO, out: Path | None = None, day: str | None = None) -> Path:
    """Write the handout's archive (every day, or ``day`` only) and return its path; nothing is written if a file
    would leak."""
    name = f"{NAME}-{day}" if day else NAME
    out = Path(out) if out is not None else course / "build" / "handout" / f"{name}.tar.gz"
    names = files(course, day)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / name
        for path in names:
            (staged / path).parent.mkdir(parents=True, exist_ok=True)
            (staged / path).write_bytes((course / path).read_bytes())
        (staged / "README.md").write_text(readme((course / "README.md").read_text(), day))
        found = given_away(staged)
        if found:
            raise RuntimeError("The handout would give away solutions or hidden tests:\n" + "\n".join(found[:20]))
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz", compresslevel=6) as archive:
            archive.add(staged, arcname=name)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        day = day_name(args[0], assignments(), "make handout") if args else None
        path = build(day=day)
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    held = f"{day}'s notebook only" if day else "every day"
    print(f"{path}: {len(files(day=day))} files, {held}, without {', '.join(LEFT_OUT)}; no solution or hidden test in any file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
