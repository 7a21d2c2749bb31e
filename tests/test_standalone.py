"""tests/standalone.py finds an exercise that needs another's answer, however the answer travels, and
does not cry wolf on names a cell binds itself."""

import nbformat
import pytest

import standalone

STUB = "# YOUR CODE HERE\nraise NotImplementedError()"


def _notebook(*cells: tuple[str, str, str | None]) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    """(source, student) from cells given as (kind, source, grade_id): kind "heading N", "solution", "test" or
    "lesson"; a solution's student version is its code before ``# answer``, then a ``raise``."""
    source, student = nbformat.v4.new_notebook(), nbformat.v4.new_notebook()
    for kind, text, grade_id in cells:
        if kind.startswith("heading"):
            number = kind.split()[1]
            for nb in (source, student):
                nb.cells.append(nbformat.v4.new_markdown_cell(f"### Exercise {number} (1 point): part {number}"))
            continue
        cell = nbformat.v4.new_code_cell(text)
        if kind in ("solution", "test"):
            cell.metadata["nbgrader"] = {"grade_id": grade_id, "solution": kind == "solution", "grade": kind == "test",
                                         **({"points": 1} if kind == "test" else {})}
        source.cells.append(cell)
        blank = nbformat.v4.new_code_cell(text.split("# answer")[0] + "raise NotImplementedError()" if kind == "solution" else text)
        blank.metadata = cell.metadata
        student.cells.append(blank)
    return source, student


def _exercise_one(extra_lesson: str) -> list:
    return [("heading 1", "", None),
            ("solution", "import math\n\ndef flops(shape):\n    # answer\n    return math.prod(shape)", "flops"),
            ("test", "assert flops((2, 3)) == 6", "test_flops"),
            ("lesson", extra_lesson, None)]


@pytest.mark.parametrize("lesson, needed", [
    ("table = {s: flops(s) for s in [(1, 2)]}", "table"),                                # a value computed from it
    ("convs = [dict(s=(1, 2))]\nfor c in convs:\n    c['flops'] = flops(c['s'])", "convs"),  # written into an object
    ("rows = []\nrows.append(flops((1, 1)))", "rows"),                                   # appended to one
    ("total = flops((1, 2))\nunrelated = 3", "unrelated"),                               # after a statement that fails
])
def test_a_name_carrying_another_exercise_s_answer_is_found(lesson, needed):
    source, student = _notebook(*_exercise_one(lesson), ("heading 2", "", None),
                                ("solution", f"def use():\n    # answer\n    return {needed}", "use"),
                                ("test", f"assert {needed} is not None", "test_use"))
    found = standalone.dependencies(source, student)
    assert found and all("exercise 1's answer" in f and needed in f for f in found), found
    assert any(f.startswith("test_use (exercise 2)") for f in found)


def test_a_name_given_by_the_day_or_bound_by_the_cell_itself_is_not_a_dependency():
    source, student = _notebook(
        *_exercise_one("shape = (4, 5)\nlabels = ['a', 'b']"),
        ("heading 2", "", None),
        ("solution", "def area(s):\n    # answer\n    return s[0] * s[1]", "area"),
        ("test", "with open('/dev/null') as f:\n    got = area(shape)\n    assert got == 20\n"
                 "for label in labels:\n    assert label\n"
                 "def check(x):\n    return x == got\nassert check(20)\nmath.sqrt(4)", "test_area"))
    assert standalone.dependencies(source, student) == []


def test_an_import_before_the_answer_is_handed_to_the_learner_and_a_function_to_write_is_not():
    assert standalone.handed_names("import numpy as np\nfrom x import y\nA = 3\n" + STUB) == {"np", "y", "A"}
    assert standalone.handed_names("import math\ndef f():\n    " + STUB.replace("\n", "\n    ")) == {"math"}
