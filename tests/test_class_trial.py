"""helpers/instructor/class_trial.py: the hostile class it makes for a day, and what it expects of grading.
(Its whole run, graded, is a maintainer's command: `python -m helpers.instructor.class_trial 1 7 11`; the
classroom test grades such a class on Day 0 in the suite.)"""

import nbformat
import pytest

from helpers.instructor import class_trial, grading


def _day(day: str):
    return (nbformat.read(grading.REPO / grading.SOURCE / day / f"{day}.ipynb", as_version=4),
            nbformat.read(grading.REPO / grading.RELEASE / day / f"{day}.ipynb", as_version=4))


@pytest.mark.parametrize("day", ["day01_import", "day07_layouts", "day11_capstone"])
def test_every_kind_of_student_damages_what_it_says_and_nothing_else(day):
    solution, release = _day(day)
    cases = class_trial.submissions(solution, release)
    assert set(cases) == {"blank", "half", "loops", "crashes", "kills_kernel", "eats_memory", "edits_tests"}
    graded = {ex.number for ex in class_trial._graded(solution)}
    assert cases["blank"][1] == graded and 0 < len(cases["half"][1]) < len(graded)
    for student, (nb, damaged) in cases.items():
        changed = [a.source for a, b in zip(nb.cells, solution.cells) if a.source != b.source]
        assert damaged <= graded and (changed or student == "blank"), student
        if student in ("loops", "crashes", "kills_kernel", "eats_memory"):
            marker = {"loops": class_trial.LOOP, "crashes": class_trial.CRASH, "kills_kernel": class_trial.KILL,
                      "eats_memory": class_trial.HOG}[student]
            assert changed == [marker] and len(damaged) == 1, student


def test_a_written_answer_is_expected_to_wait_for_the_instructor_unless_left_as_released():
    solution, release = _day("day11_capstone")
    expected = class_trial.expected_points(solution, damaged={1})
    assert expected["Exercise 1"] == 0 and expected["Exercise 2"] == 2 and expected["Exercise 3 (written)"] is None
    assert class_trial.expected_points(solution, damaged=set(), answered=False)["Exercise 3 (written)"] == 0
    cases = class_trial.submissions(solution, release)
    assert [s for s, (nb, _) in cases.items() if not class_trial._answered(nb, release)] == ["blank", "half"]
