"""The student notebooks speak to the learner (tests/prose_rules.py), and the rules catch what they guard."""

import json

import pytest

import prose_rules
from helpers.instructor import grading

REPO = grading.REPO
DAYS = grading.assignments()


def _student(day: str) -> list[dict]:
    return json.loads((REPO / grading.RELEASE / day / f"{day}.ipynb").read_text())["cells"]


def _text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("day", DAYS)
def test_a_student_notebook_says_nothing_about_how_the_course_was_made(day):
    found = [f"cell {i}: {p}" for i, cell in enumerate(_student(day))
             for p in prose_rules.problems_in_text(_text(cell), cell["cell_type"])]
    assert not found, f"{day}:\n" + "\n".join(found)


@pytest.mark.parametrize("day", DAYS)
def test_exercise_headings_have_one_form_and_announce_their_points(day):
    found = prose_rules.exercise_problems(_student(day))
    assert not found, f"{day}:\n" + "\n".join(found)


@pytest.mark.parametrize("day", DAYS)
def test_each_day_opens_with_its_goals_its_time_and_the_glossary(day):
    found = prose_rules.opening_problems(_text(_student(day)[0]))
    assert not found, f"{day}:\n" + "\n".join(found)


def test_the_glossary_is_beside_the_days_and_defines_its_terms():
    glossary = (REPO / grading.RELEASE / "GLOSSARY.md").read_text()
    terms = [line for line in glossary.splitlines() if line.startswith("**")]
    assert len(terms) >= 30, "the glossary should define the course's terms, one '**term**' line each"
    names = [line.split("**")[1].strip("`").casefold() for line in terms]
    assert names == sorted(names), "the glossary's terms should be in alphabetical order"
    for term in ("TOPI", "NVRTC", "tirx", "T.sblock", "Relax", "TensorIR", "MetaSchedule", "IQR"):
        assert any(name == term.casefold() or name.startswith(term.casefold() + " ") for name in names), \
            f"the glossary does not define {term}"


# ---------------------------------------------------------------- the rules catch what they guard

PLANTED = {
    "the course's CI": ("markdown", "This keeps the notebook within its time budget in CI, which runs it twice."),
    "the course's quick mode": ("markdown", "Quick mode leaves this out."),
    "notes about how the course was made": ("code", "# gave 3.4x to 22.8x over 42 runs of this solution"),
    "a date of measurement": ("markdown", "Measured 2026-11-25 on a Xeon."),
    "changelog phrasing": ("markdown", "The gates were slow until Day 7's element-wise kernels got a schedule of their own."),
    "a formula in dollar signs (the website renders no math)": ("markdown", "The peak is $$a \\times b$$ per core."),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_rule_catches_a_planted_example(name):
    cell_type, text = PLANTED[name]
    found = prose_rules.problems_in_text(text, cell_type)
    assert any(p.startswith(name) for p in found), f"{name!r} missed {text!r}: {found}"


def test_ordinary_prose_and_code_pass():
    assert not prose_rules.problems_in_text("TVM compiles the model; we then time it against PyTorch eager.", "markdown")
    assert not prose_rules.problems_in_text("Run `TVM_COURSE_QUICK=1 make test`: the `$OUT` folder.", "markdown")
    assert not prose_rules.problems_in_text("x = config.pick(100, 10)  # fewer repeats when asked", "code")
    # a module or a file named after the maintainers is a name, not a note about them
    assert not prose_rules.problems_in_text('print(".venv/bin/python -m helpers.maintainers.benchmark table")', "code")
    assert prose_rules.problems_in_text("# the maintainers tuned this twice", "code")


def test_a_paragraph_over_the_limit_is_caught_and_a_list_is_read_item_by_item():
    wall = " ".join(["word"] * (prose_rules.MAX_WORDS + 1))
    assert any("a paragraph of" in p for p in prose_rules.problems_in_text(wall, "markdown"))
    items = "\n".join(f"- {' '.join(['word'] * 100)}" for _ in range(3))
    assert not prose_rules.problems_in_text(items, "markdown")


def _md(text):
    return {"cell_type": "markdown", "source": text, "metadata": {}}


def _test_cell(points, grade_id="t"):
    return {"cell_type": "code", "source": "assert True", "metadata": {"nbgrader": {"grade": True, "points": points, "grade_id": grade_id}}}


def _solution_cell(grade_id="s"):
    return {"cell_type": "code", "source": "x = 1", "metadata": {"nbgrader": {"solution": True, "grade_id": grade_id}}}


def test_exercise_rules_catch_wrong_points_forms_and_orphans():
    good = [_md("### Exercise 1 (3 points): a thing"), _solution_cell(), _test_cell(2), _test_cell(1), _md("## 2. Next"),
            _md("### Exercise 2 (1 point): more"), _solution_cell(), _test_cell(1)]
    assert prose_rules.exercise_problems(good) == []
    assert any("carry 2" in p for p in prose_rules.exercise_problems([_md("### Exercise 1 (3 points): a"), _solution_cell(), _test_cell(2)]))
    assert any("no solution cell" in p for p in prose_rules.exercise_problems([_md("### Exercise 1 (1 point): a"), _test_cell(1)]))
    assert any("not in the form" in p for p in prose_rules.exercise_problems([_md("**Exercise 1 (2 points).** Write it"), _test_cell(2)]))
    assert any("not in the form" in p for p in prose_rules.exercise_problems([_md("### Live check (1 point): top-k"), _test_cell(1)]))
    assert any("under no exercise" in p for p in prose_rules.exercise_problems([_md("## 1. Intro"), _test_cell(1)]))
    assert any("numbered 3" in p for p in prose_rules.exercise_problems([_md("### Exercise 3 (1 point): a"), _test_cell(1)]))


def test_opening_rules_catch_a_missing_time_and_too_few_goals():
    good = ("# Day 3 — Build\n\nText.\n\n**You will be able to**\n1. a\n2. b\n3. c\n\n"
            "**Time:** about 2 hours.\n**Glossary:** [terms](../GLOSSARY.md)\n")
    assert prose_rules.opening_problems(good) == []
    assert prose_rules.stated_hours(good) == 2
    assert prose_rules.stated_hours("**Time:** about 45 minutes") == 0.75
    assert any("Time" in p for p in prose_rules.opening_problems(good.replace("**Time:** about 2 hours.", "")))
    assert any("3 to 5" in p for p in prose_rules.opening_problems(good.replace("3. c\n", "")))
