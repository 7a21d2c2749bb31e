"""A class's submissions from a learning platform, graded with their due date: a Canvas-style zip and a
Moodle-style folder made from Day 0's solution and student notebooks, imported (roster, notebooks, times),
autograded by the real nbgrader on a real gradebook, with a late penalty (nbgrader's ``zero``)."""

import csv
import os
import time
import zipfile
from datetime import datetime, timezone

import nbformat
import pytest

from helpers.errors import GradingError
from helpers.instructor import grading, lms_import

DAY = "day00_environment"
DUE = "2026-03-02 12:00 UTC"
ON_TIME, LATE = (2026, 3, 1, 10, 0, 0), (2026, 3, 3, 9, 0, 0)


@pytest.fixture
def utc(monkeypatch):
    """The zip's times are read in this machine's zone: UTC here, so that the test reads the same anywhere."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _notebooks(course):
    solution = nbformat.read(course / grading.SOURCE / DAY / f"{DAY}.ipynb", as_version=4)
    blank = nbformat.read(course / grading.RELEASE / DAY / f"{DAY}.ipynb", as_version=4)
    half = nbformat.from_dict(blank)  # the first exercise solved: 2 of 4 points
    first = next(c for c in solution.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "float32_lanes")
    next(c for c in half.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "float32_lanes").source = first.source
    return {name: nbformat.writes(nb).encode() for name, nb in (("solution", solution), ("blank", blank), ("half", half))}


def _canvas_zip(path, nbs):
    with zipfile.ZipFile(path, "w") as archive:
        for name, when, data in [
            (f"lovelaceada_1001_5001_{DAY}.ipynb", ON_TIME, nbs["solution"]),
            (f"babbagecharles_LATE_1002_5002_{DAY}.ipynb", LATE, nbs["solution"]),      # late by the zip's time
            ("hoppergrace_1003_5003_my work.ipynb", LATE, nbs["half"]),                 # on time by the CSV
            ("lovelaceada_1001_5001_notes.txt", ON_TIME, b"my notes"),                  # not a notebook: skipped
        ]:
            archive.writestr(zipfile.ZipInfo(name, date_time=when), data)
    return path


def _moodle_folder(root, nbs):
    for folder, name, when, data in [
        ("José Núñez_2001_assignsubmission_file_", f"{DAY}.ipynb", LATE, nbs["solution"]),   # late by the file's time
        ("Alan Turing_2002_assignsubmission_file_", f"{DAY}.ipynb", ON_TIME, nbs["blank"]),
        ("Alan Turing_2002_assignsubmission_onlinetext_", "onlinetext.html", ON_TIME, b"<p>hi</p>"),
    ]:
        path = root / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        stamp = datetime(*when, tzinfo=timezone.utc).timestamp()
        os.utime(path, (stamp, stamp))
    return root


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = grading.scratch_course(tmp_path_factory.mktemp("lms"), [DAY])
    grading.generate(DAY, course)
    with open(course / "nbgrader_config.py", "a") as config:
        config.write('\nc.LateSubmissionPlugin.penalty_method = "zero"  # a late submission scores 0\n')
    return course


def test_a_canvas_zip_and_a_moodle_folder_are_graded_with_their_due_date(course, tmp_path, utc):
    nbs = _notebooks(course)
    times = tmp_path / "times.csv"
    times.write_text("student,timestamp\nhoppergrace,2026-03-02T11:59:00+00:00\n")
    canvas, skipped = lms_import.import_submissions("0", _canvas_zip(tmp_path / "canvas.zip", nbs), course, times=times, due=DUE)
    moodle, skipped_moodle = lms_import.import_submissions("day00", _moodle_folder(tmp_path / "moodle", nbs), course)

    when = {f.learner.student: (f.submitted, f.time_from) for f in canvas + moodle}
    assert when == {
        "lovelaceada": (datetime(*ON_TIME, tzinfo=timezone.utc), "the zip entry's time"),
        "babbagecharles": (datetime(*LATE, tzinfo=timezone.utc), "the zip entry's time"),
        "hoppergrace": (datetime(2026, 3, 2, 11, 59, tzinfo=timezone.utc), "times.csv"),
        "jose_nunez": (datetime(*LATE, tzinfo=timezone.utc), "the file's time"),
        "alan_turing": (datetime(*ON_TIME, tzinfo=timezone.utc), "the file's time"),
    }
    assert skipped == ["lovelaceada_1001_5001_notes.txt (lovelaceada): not a notebook"]
    assert skipped_moodle == ["Alan Turing_2002_assignsubmission_onlinetext_/onlinetext.html (alan_turing): not a notebook"]
    for filed in canvas + moodle:
        assert filed.notebook == course / "submitted" / filed.learner.student / DAY / f"{DAY}.ipynb"
        assert (filed.notebook.parent / "timestamp.txt").read_text().endswith(" UTC\n")

    grading.autograde(DAY, course, cell_timeout=120)

    from nbgrader.api import Gradebook

    with Gradebook(grading.gradebook_url(course), "tvm-course") as gb:
        assert gb.find_assignment(DAY).duedate == datetime(2026, 3, 2, 12, 0)
        roster = {s.id: (s.first_name, s.last_name, s.lms_user_id) for s in gb.students}
        got = {sub.student_id: (sub.score, sub.late_submission_penalty) for sub in gb.assignment_submissions(DAY)}
    assert roster["jose_nunez"] == ("José", "Núñez", "2001") and roster["lovelaceada"] == (None, None, "1001")
    # (raw points, late penalty): the late ones lost all their points, nbgrader's 'zero' penalty
    assert got == {"lovelaceada": (4.0, 0.0), "babbagecharles": (4.0, 4.0), "hoppergrace": (2.0, 0.0),
                   "jose_nunez": (4.0, 4.0), "alan_turing": (0.0, 0.0)}
    grading.nbgrader("export", f"--to={tmp_path / 'grades.csv'}", course=course)  # nbgrader's own: score = raw - penalty
    rows = {r["student_id"]: r for r in csv.DictReader((tmp_path / "grades.csv").open())}
    assert {s: float(r["score"]) for s, r in rows.items()} == {"lovelaceada": 4.0, "babbagecharles": 0.0,
                                                               "hoppergrace": 2.0, "jose_nunez": 0.0, "alan_turing": 0.0}


def test_files_no_naming_places_stop_the_import_and_are_all_listed(course, tmp_path, utc):
    nbs = _notebooks(course)
    with zipfile.ZipFile(tmp_path / "odd.zip", "w") as archive:
        archive.writestr("ada.ipynb", nbs["blank"])                                       # no platform's name
        archive.writestr("smithjo_7_8_draft.ipynb", nbs["blank"])                          # two notebooks, neither the day's
        archive.writestr("smithjo_7_8_final.ipynb", nbs["blank"])
        archive.writestr(f"__MACOSX/._lovelaceada_1_2_{DAY}.ipynb", b"")                  # macOS's litter: ignored
    before = sorted((course / "submitted").rglob("*")) if (course / "submitted").exists() else []
    with pytest.raises(GradingError) as err:
        lms_import.import_submissions(DAY, tmp_path / "odd.zip", course)
    message = str(err.value)
    assert message.startswith("Nothing was imported; these files could not be placed:")
    assert "ada.ipynb: neither Canvas's" in message and "smithjo: 2 notebooks" in message and "__MACOSX" not in message
    after = sorted((course / "submitted").rglob("*")) if (course / "submitted").exists() else []
    assert after == before


@pytest.mark.parametrize("text, expected", [
    ("2026-03-02 23:59 Europe/Berlin", datetime(2026, 3, 2, 22, 59, tzinfo=timezone.utc)),
    ("2026-03-02T23:59+01:00", datetime(2026, 3, 2, 22, 59, tzinfo=timezone.utc)),
    ("2026-03-02 23:59", datetime(2026, 3, 2, 23, 59, tzinfo=timezone.utc)),  # no zone: this machine's (UTC here)
])
def test_times_are_read_with_their_zone(text, expected, utc):
    assert lms_import.parse_time(text) == expected


def test_the_command_line_says_what_is_missing_in_one_line(tmp_path, capsys):
    assert lms_import.main(["import", "1", str(tmp_path / "missing.zip")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "neither a zip nor a folder" in err and err.count("\n") == 1, err
