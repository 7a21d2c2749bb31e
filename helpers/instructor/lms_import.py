"""`make import DAY=1 FROM=download.zip`: a class's submissions as a learning platform hands them out, filed for
nbgrader with each learner's submission time, so that due dates and late penalties apply.

A class that hands in on Canvas or Moodle gives the instructor one download per assignment, not nbgrader's
exchange. This reads it (a zip, or the folder it unpacks to), and for every learner in it:

* adds them to the gradebook's roster (``nbgrader db student import``), with their platform's user id, and
  their names where the platform gives them (Moodle);
* files their notebook as ``make submit`` does (``submitted/<student>/<day>/<day>.ipynb``);
* writes the time they handed in to ``submitted/<student>/<day>/timestamp.txt``, which nbgrader's autograde
  reads to tell a late submission from one on time (nbgrader's exchange writes that file; here nobody else does).

The platforms name what they hand out, but give no time in the names:

* Canvas ("Download Submissions"): a zip of files ``<login>_<user id>_<submission id>_<file name>``
  (``<login>_LATE_<user id>_...`` when Canvas saw it late); the learner's id is the login.
* Moodle ("Download all submissions"): a zip of folders ``<Full Name>_<participant id>_assignsubmission_file_/``
  holding the learner's files; the learner's id is their name in lower case, ``_`` between the words.

So the time is each file's modification time in the download (the zip entry's; a zip keeps it without a
zone, so it is read in this machine's zone: set ``TZ`` to the platform's), unless a CSV ``student,timestamp``
gives it (``--times``), e.g. from the platform's gradebook export. A file neither naming can place, or a learner
with several notebooks and none named after the day, stops the import before anything is filed, with every
such file listed.

    python -m helpers.instructor.lms_import import DAY ZIP_OR_FOLDER [--times times.csv] [--due "2026-03-02 23:59 Europe/Berlin"]
"""

from __future__ import annotations

import csv
import re
import sys
import tempfile
import unicodedata
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from ..errors import GradingError
from . import grading
from .days import day_name

CANVAS = re.compile(r"^(?P<login>.+?)(?:_LATE)?_(?P<user>\d+)_(?P<submission>\d+)_(?P<name>.+)$")
MOODLE = re.compile(r"^(?P<full>.+)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_$")
IGNORED = ("__MACOSX", ".ipynb_checkpoints")
# nbgrader's own exchange writes timestamp.txt in this format (utils.get_timestamp); parse_utc reads it back.
STAMP = "%Y-%m-%d %H:%M:%S.%f UTC"


@dataclass(frozen=True)
class Entry:
    """A file of the download: its path there, its bytes (notebooks only: nothing else is filed), and its time."""

    path: str
    data: bytes | None
    modified: datetime  # UTC


@dataclass(frozen=True)
class Learner:
    """A learner as the gradebook's roster records them (nbgrader's Student)."""

    student: str
    lms_user_id: str
    first_name: str = ""
    last_name: str = ""


@dataclass(frozen=True)
class Filed:
    """One learner's notebook, filed: where, and when they handed it in (and where that time came from)."""

    learner: Learner
    notebook: Path
    submitted: datetime
    time_from: str


def as_utc(moment: datetime) -> datetime:
    """A time in UTC; one without a zone is this machine's local time (``TZ``), as a zip's times are."""
    return (moment if moment.tzinfo else moment.astimezone()).astimezone(timezone.utc)


def parse_time(text: str) -> datetime:
    """A time as an instructor writes one: ISO 8601 with or without an offset, or ``2026-03-02 23:59 Europe/Berlin``
    (nbgrader's form, a zone name last); without a zone, this machine's. In UTC."""
    import dateutil.parser  # (nbgrader's dependency: the parser its own due dates go through)
    import dateutil.tz  # (the same)

    parts = text.strip().split(" ")
    try:
        if len(parts) == 3 and (zone := dateutil.tz.gettz(parts[2])) is not None:
            return as_utc(dateutil.parser.parse(" ".join(parts[:2])).replace(tzinfo=zone))
        return as_utc(dateutil.parser.parse(text.strip()))
    except (ValueError, OverflowError):
        raise GradingError(f"{text!r} is not a time: write it as 2026-03-02 23:59 Europe/Berlin, or 2026-03-02T23:59+01:00.") from None


def entries(source: Path) -> list[Entry]:
    """Every file of a download, a zip or the folder it was unpacked to (macOS's and Jupyter's litter left out)."""
    source = Path(source)
    found = []
    if source.is_file() and zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                if not info.is_dir():
                    found.append(Entry(info.filename, archive.read(info) if info.filename.endswith(".ipynb") else None,
                                       as_utc(datetime(*info.date_time))))
    elif source.is_dir():
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            found.append(Entry(path.relative_to(source).as_posix(), path.read_bytes() if path.suffix == ".ipynb" else None,
                               datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)))
    else:
        raise GradingError(f"{source} is neither a zip nor a folder: give the platform's download (FROM=path/to/download.zip).")
    return [e for e in found if not any(part in IGNORED or part.startswith(".") for part in PurePosixPath(e.path).parts)]


def _slug(full_name: str) -> str:
    """``José Núñez`` -> ``jose_nunez``: a name as an id nbgrader can put in a path."""
    plain = unicodedata.normalize("NFKD", full_name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "_", plain.lower()).strip("_")


def learner_of(path: str) -> tuple[Learner, str] | None:
    """Whose file this is, and its name as the learner handed it in; None where neither platform's naming fits."""
    parts = PurePosixPath(path).parts
    for folder in parts[:-1]:
        if moodle := MOODLE.match(folder):
            first, _, last = moodle["full"].strip().partition(" ")
            return Learner(_slug(moodle["full"]), moodle["user"], first, last), parts[-1]
    if canvas := CANVAS.match(parts[-1]):
        return Learner(canvas["login"].lower(), canvas["user"]), canvas["name"]
    return None


def place(found: list[Entry], day: str) -> tuple[dict[Learner, Entry], list[str]]:
    """Each learner's notebook for ``day``, and what was skipped (files that are not notebooks). A file no naming
    places, a learner with several notebooks none of which is named after the day, and two learners with one id
    are refused, all of them in one error."""
    candidates: dict[Learner, list[tuple[str, Entry]]] = {}
    unplaced, skipped = [], []
    for entry in found:
        owner = learner_of(entry.path)
        if owner is None:
            unplaced.append(f"{entry.path}: neither Canvas's <login>_<user id>_<submission id>_<file> nor in a Moodle "
                            "folder <Full Name>_<id>_assignsubmission_file_/")
        elif entry.data is None:
            skipped.append(f"{entry.path} ({owner[0].student}): not a notebook")
        else:
            candidates.setdefault(owner[0], []).append((owner[1], entry))
    placed = {}
    for learner, notebooks in sorted(candidates.items(), key=lambda item: item[0].student):
        # Canvas names a file handed in again <name>-1.ipynb
        named = [e for name, e in notebooks if re.fullmatch(rf"{re.escape(day)}(-\d+)?\.ipynb", name)]
        if len(notebooks) == 1 or len(named) == 1:
            placed[learner] = notebooks[0][1] if len(notebooks) == 1 else named[0]
        else:
            unplaced.append(f"{learner.student}: {len(notebooks)} notebooks ({', '.join(e.path for _, e in notebooks)}), "
                            f"none of them alone named {day}.ipynb: keep the one to grade")
    ids: dict[str, list[Learner]] = {}
    for learner in placed:
        ids.setdefault(learner.student, []).append(learner)
    unplaced += [f"{student}: {len(same)} learners (user ids {', '.join(l.lms_user_id for l in same)}) would share this id"
                 for student, same in ids.items() if len(same) > 1]
    if unplaced:
        raise GradingError("Nothing was imported; these files could not be placed:\n  " + "\n  ".join(unplaced))
    return placed, skipped


def read_times(path: Path) -> dict[str, datetime]:
    """``student,timestamp`` rows (a header row is allowed): the time each learner handed in, in UTC."""
    times = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row or row[0].strip().lower() in ("student", "student_id", "id"):
                continue
            if len(row) < 2:
                raise GradingError(f"{path}: the row {row!r} is not student,timestamp.")
            times[row[0].strip()] = parse_time(row[1])
    return times


def import_submissions(day: str, source: Path, course: Path = grading.REPO, times: Path | None = None,
                       due: str | None = None) -> tuple[list[Filed], list[str]]:
    """File every learner's notebook of ``day`` from the platform's download ``source``, with the roster and the
    times; ``due`` (a time, as ``parse_time`` reads it) records the day's due date in the gradebook. Returns what
    was filed, and the files skipped (not notebooks)."""
    day = day_name(day, grading.assignments(course), "make import")
    placed, skipped = place(entries(source), day)
    if not placed:
        raise GradingError(f"No notebook in {source}: give the platform's download of the day's submissions.")
    given = read_times(times) if times else {}
    strangers = sorted(set(given) - {learner.student for learner in placed})
    if strangers:
        raise GradingError(f"{times} gives times for {', '.join(strangers)}, who handed nothing in here: "
                           f"the download's learners are {', '.join(sorted(l.student for l in placed))}.")
    with tempfile.TemporaryDirectory(prefix="lms-import-") as tmp:
        roster = Path(tmp) / "roster.csv"
        with open(roster, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "first_name", "last_name", "lms_user_id"])
            writer.writerows([l.student, l.first_name, l.last_name, l.lms_user_id] for l in placed)
        grading.nbgrader("db", "student", "import", str(roster), course=course)
        if due:
            grading.nbgrader("db", "assignment", "add", day, f"--duedate={parse_time(due).strftime(STAMP)}", course=course)
        filed = []
        for learner, entry in placed.items():
            incoming = Path(tmp) / learner.student / f"{day}.ipynb"
            incoming.parent.mkdir()
            incoming.write_bytes(entry.data or b"")
            notebook = grading.submit(course, day, learner.student, incoming)
            submitted = given.get(learner.student, entry.modified)
            (notebook.parent / "timestamp.txt").write_text(submitted.strftime(STAMP) + "\n")
            time_from = (times.name if times and learner.student in given
                         else "the zip entry's time" if Path(source).is_file() else "the file's time")
            filed.append(Filed(learner, notebook, submitted, time_from))
    return filed, skipped


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.instructor.lms_import", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("import", help="file a Canvas or Moodle download's notebooks for nbgrader")
    cmd.add_argument("day", help="3, 03, day03 or day03_build")
    cmd.add_argument("source", type=Path, help="the platform's download: a zip, or the folder it unpacks to")
    cmd.add_argument("--times", type=Path, help="a CSV student,timestamp: these times instead of the files' own")
    cmd.add_argument("--due", help="the day's due date, e.g. '2026-03-02 23:59 Europe/Berlin' (no zone: this machine's)")
    args = parser.parse_args(argv)
    try:
        filed, skipped = import_submissions(args.day, args.source, grading.REPO, times=args.times, due=args.due)
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for item in filed:
        print(f"{item.learner.student}: {item.notebook.relative_to(grading.REPO)}, handed in "
              f"{item.submitted:%Y-%m-%d %H:%M:%S} UTC ({item.time_from})")
    for line in skipped:
        print(f"skipped {line}")
    if args.due:
        print(f"Due {parse_time(args.due):%Y-%m-%d %H:%M} UTC: a notebook handed in later is late, its penalty as "
              "nbgrader_config.py's c.LateSubmissionPlugin.penalty_method says (nbgrader's default: none).")
    zone = datetime.now().astimezone().tzname()
    print(f"{len(filed)} filed, each learner in the roster. The times are the download's own, read in this machine's "
          f"zone ({zone}; set TZ=... to the platform's) where they have none: where the platform lists other times, "
          f"give them with TIMES=times.csv (student,timestamp). Then: make autograde DAY={filed[0].notebook.parent.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
