"""A day with a written answer, graded as an instructor does it (Day 11's path, on a day of three cells):
autograde leaves the written points "to be graded" (not 0) in the report and the CSV, shows the grader the
learner's own numbers beside the answer, refuses feedback that would say 0 points, and once the written
answer is graded, as the Formgrader records it, every total is there."""

import csv
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from helpers.errors import GradingError
from helpers.instructor import grade_table, grading
from helpers.instructor.learner_outputs import SHOWN, TAG

DAY = "day90_written"


def _source() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "tvm-course", "display_name": "TVM course",
                                                           "language": "python"}})

    def graded(cell, **meta):
        cell.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "task": False, **meta}
        return cell

    measured = nbformat.v4.new_code_cell("print(f'speedup on this machine: {1.5:.1f}x')")
    measured.metadata["tags"] = [TAG]
    nb.cells = [
        nbformat.v4.new_markdown_cell("### Exercise 1 (1 point): double it"),
        graded(nbformat.v4.new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
               grade=False, solution=True, grade_id="double"),
        graded(nbformat.v4.new_code_cell("assert double(2) == 4"), grade=True, solution=False, grade_id="test_double",
               points=1, locked=True),
        measured,
        nbformat.v4.new_markdown_cell("### Exercise 2 (2 points, graded by your instructor): why?"),
        graded(nbformat.v4.new_markdown_cell("**How your answer is graded**: 2 points for a reason from your numbers."),
               grade=False, solution=False, grade_id="rubric", locked=True),
        graded(nbformat.v4.new_markdown_cell("Because it is twice as fast."), grade=True, solution=True,
               grade_id="written", points=2),
    ]
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = grading.scratch_course(tmp_path_factory.mktemp("written"), names=[])
    (course / grading.SOURCE / DAY).mkdir(parents=True)
    nbformat.write(_source(), course / grading.SOURCE / DAY / f"{DAY}.ipynb")
    grading.generate(DAY, course)
    submission = nbformat.read(course / grading.SOURCE / DAY / f"{DAY}.ipynb", as_version=4)
    submission.cells[3].outputs = [nbformat.v4.new_output("stream", text="speedup on this machine: 9.9x\n")]  # the learner's
    submission.cells[6].source = "ResNet-50 gains least here: 9.9x."
    nbformat.write(submission, course / "ada.ipynb")
    grading.submit(course, DAY, "ada", course / "ada.ipynb")
    grading.autograde(DAY, course, cell_timeout=60)
    return course


def test_before_the_written_answer_is_graded_it_is_pending_everywhere_and_feedback_waits(course, tmp_path):
    lines, problems = grade_table.report(DAY, course)
    assert lines == ["ada: 1 / 1 autograded; Exercise 2 (written): to be graded"] and problems == []
    row = next(csv.DictReader(grade_table.write_csv(tmp_path / "grades.csv", course).open()))
    assert row == {"student": "ada", f"{DAY}: Exercise 1 (1)": "1", f"{DAY}: Exercise 2 (written) (2)": "to be graded",
                   f"{DAY}: total": ""}
    with pytest.raises(GradingError, match="ada are not graded yet.*ALLOW_UNGRADED=1"):
        grading.feedback(DAY, course)
    assert grading.feedback(DAY, course, allow_ungraded=True)


def test_the_grader_sees_the_learner_s_own_numbers_above_the_answer(course):
    nb = nbformat.read(course / "autograded" / "ada" / DAY / f"{DAY}.ipynb", as_version=4)
    shown = next(i for i, c in enumerate(nb.cells) if c.metadata.get(SHOWN))
    assert "9.9x" in nb.cells[shown].source and "1.5x" not in nb.cells[shown].source
    assert nb.cells[shown + 1].metadata["nbgrader"]["grade_id"] == "written"
    assert "1.5x" in "".join(o.get("text", "") for o in nb.cells[3].outputs), "the run itself is the grading machine's"


def test_the_formgrader_runs_off_the_hub_and_shows_the_rubric_the_numbers_and_the_answer(course):
    """`make formgrader`'s server (JupyterLab at the course root) on this course: the submission waits for a
    manual grade, and its page holds what the grader needs."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bin_dir = Path(sys.executable).parent
    server = subprocess.Popen([str(bin_dir / "jupyter"), "lab", "--no-browser", "--allow-root", f"--port={port}",
                               "--ServerApp.token=t", f"--ServerApp.root_dir={course}", "--ServerApp.default_url=/formgrader"],
                              cwd=course, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    get = lambda path: urllib.request.urlopen(f"http://127.0.0.1:{port}{path}{'&' if '?' in path else '?'}token=t", timeout=30).read().decode()
    try:
        for _ in range(60):
            try:
                notebooks = json.loads(get(f"/formgrader/api/submitted_notebooks/{DAY}/{DAY}"))
                break
            except OSError:
                time.sleep(1)
        (ada,) = notebooks
        assert ada["student"] == "ada" and ada["needs_manual_grade"]
        page = get(f"/formgrader/submissions/{ada['id']}")
        for shown in ("How your answer is graded", "9.9x", "ResNet-50 gains least here"):
            assert shown in page, shown
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_once_graded_as_the_formgrader_records_it_every_total_is_there(course, tmp_path):
    from nbgrader.api import Gradebook

    with Gradebook(grading.gradebook_url(course)) as gb:
        grade = gb.find_grade("written", DAY, DAY, "ada")
        grade.manual_score, grade.needs_manual_grade = 2, False  # what the Formgrader's save does
        gb.db.commit()
    assert grade_table.report(DAY, course)[0] == ["ada: 1 / 1 autograded; total 3 / 3"]
    row = next(csv.DictReader(grade_table.write_csv(tmp_path / "grades.csv", course).open()))
    assert row[f"{DAY}: Exercise 2 (written) (2)"] == "2" and row[f"{DAY}: total"] == "3"
    assert grading.ungraded(DAY, course) == [] and grading.feedback(DAY, course)
