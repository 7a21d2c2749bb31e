"""`make handout`: the course as a class gets it, without the solutions and the hidden tests.

A clone of the repository holds ``solutions/`` (every answer and hidden test) and ``tests/`` (which
read them). The handout is every file git keeps, less those two folders and the CI script, packed
as ``build/handout/tvm-course-handout.tar.gz``; it is refused if a file a learner reads holds a line
of a solution or hidden test (the website's check, ``site.leaks``), or any file a line of a hidden
test (see ``given_away``).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import nbformat

from .feedback_hidden import hidden_test_lines, shown
from .grading import REPO, SOURCE, assignments
from .site import _readable, leaks

LEFT_OUT = (f"{SOURCE}/", "tests/", ".ci/")
NAME = "tvm-course-handout"


def files(course: Path = REPO) -> list[str]:
    """What the handout holds: the files git keeps (tracked, or new and not ignored), less ``LEFT_OUT``."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=course,
                         capture_output=True, text=True, check=True).stdout
    return sorted(name for name in out.splitlines()
                  if not name.startswith(LEFT_OUT) and (course / name).is_file())


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


def build(course: Path = REPO, out: Path | None = None) -> Path:
    """Write the handout's archive and return its path; nothing is written if a file would leak."""
    out = Path(out) if out is not None else course / "build" / "handout" / f"{NAME}.tar.gz"
    names = files(course)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / NAME
        for name in names:
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            (staged / name).write_bytes((course / name).read_bytes())
        found = given_away(staged)
        if found:
            raise RuntimeError("The handout would give away solutions or hidden tests:\n" + "\n".join(found[:20]))
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz") as archive:
            archive.add(staged, arcname=NAME)
    return out


def main() -> int:
    path = build()
    print(f"{path}: {len(files())} files, without {', '.join(LEFT_OUT)}; no solution or hidden test in any file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
