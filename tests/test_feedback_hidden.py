"""Feedback keeps the hidden tests hidden in the outputs too: a traceback's context lines are replaced; every
feedback the course makes is made so, and `make check`'s messages too (tests/test_classroom.py greps real
feedback for every hidden line)."""

import nbformat
from nbgrader import preprocessors
from nbgrader.converters import Autograde, GenerateFeedback
from nbgrader.coursedir import CourseDirectory
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from helpers.instructor import grading, hub, selfstudy
from helpers.instructor.feedback_hidden import FEEDBACK_PREPROCESSORS, MARK, HideHiddenTestsInOutputs, hide, hidden_lines, shown

SOURCE = """x = answer()
assert x == 2, f"expected 2, got {x}"
### BEGIN HIDDEN TESTS
for secret in [17, 19]:
    assert answer(secret) == secret + 1
### END HIDDEN TESTS
"""

# IPython's traceback, colours included: the failing visible line and three lines after it
TRACEBACK = ("\x1b[0;31m---------------------------------------------------------------------------\x1b[0m\n"
             "Cell \x1b[0;32mIn[6], line 2\x1b[0m\n"
             "\x1b[1;32m      1\x1b[0m x \x1b[38;5;241m=\x1b[39m answer()\n"
             "\x1b[0;32m----> 2\x1b[0m \x1b[38;5;28;01massert\x1b[39;00m x \x1b[38;5;241m==\x1b[39m 2\n"
             "\x1b[1;32m      3\x1b[0m ### BEGIN HIDDEN TESTS\n"
             "\x1b[1;32m      4\x1b[0m for secret in [17, 19]:\n"
             "\x1b[1;32m      5\x1b[0m     assert answer(secret) == secret + 1\n")


def test_a_traceback_that_shows_hidden_lines_shows_marks_instead():
    hidden = hidden_lines(SOURCE)
    assert hidden == {"for secret in [17, 19]:", "assert answer(secret) == secret + 1"}
    shown = hide(TRACEBACK, hidden)
    assert "secret" not in shown and shown.count(MARK) == 2
    assert "answer()" in shown and "----> 2" in shown, "the visible lines, the failing one too, stay"


def test_a_hidden_line_is_found_wherever_a_file_shows_it():
    line = 'assert answer(secret) == secret + 1, "für secret"'
    forms = {
        "as it is, glued to the words around it": f"xassert answer(secret) == secret + 1, \"für secret\"yz",
        "escaped in a notebook's JSON": '{"source": ["' + 'assert answer(secret) == secret + 1, \\"für secret\\"' + '\\n"]}',
        "split into HTML spans": '<span class="k">assert</span> answer(secret) <span>==</span> secret + 1, '
                                 '<span>&quot;für secret&quot;</span>',
    }
    for where, text in forms.items():
        assert shown(text, {line, "a line that is nowhere at all"}) == [line], where
    assert shown("assert answer(other) == secret + 1", {line}) == []


def test_the_preprocessor_changes_outputs_of_cells_with_hidden_tests_only():
    failing = nbformat.v4.new_code_cell(SOURCE, outputs=[nbformat.v4.new_output(
        "error", ename="AssertionError", evalue="expected 2, got 3", traceback=TRACEBACK.split("\n"))])
    printing = nbformat.v4.new_code_cell("print('for secret in [17, 19]:')", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="for secret in [17, 19]:\n")])
    nb = nbformat.v4.new_notebook(cells=[failing, printing])
    nb, _ = HideHiddenTestsInOutputs().preprocess(nb, {})
    assert not any("secret" in line for line in nb.cells[0].outputs[0].traceback)
    assert nb.cells[0].outputs[0].evalue == "expected 2, got 3", "the failing test's message stays"
    assert nb.cells[1].outputs[0].text == "for secret in [17, 19]:\n", "a cell without hidden tests is left alone"


def test_make_check_hides_a_hidden_line_that_a_warning_printed():
    # what IPython writes to stderr when a hidden test's line calls code that warns (stacklevel=2)
    stderr = ("/tmp/ipykernel_7006/3797621153.py:5: UserWarning: slow path\n"
              "  assert answer(secret) == secret + 1\n")
    cell = nbformat.v4.new_code_cell(SOURCE, outputs=[nbformat.v4.new_output("stream", name="stderr", text=stderr)])
    message = selfstudy._failure(cell)
    assert "secret" not in message and MARK in message and "UserWarning: slow path" in message, message
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="expected 2, got 3",
                                           traceback=TRACEBACK.split("\n"))]
    assert selfstudy._failure(cell) == "AssertionError: expected 2, got 3"


def _config(path) -> Config:
    return PyFileConfigLoader(path.name, path=str(path.parent)).load_config()


def test_every_feedback_the_course_makes_clears_the_hidden_tests(tmp_path):
    """The repository's config (`make feedback`, `make check`) and the hub's course directory's."""
    assert _config(grading.REPO / "nbgrader_config.py").GenerateFeedback.preprocessors == FEEDBACK_PREPROCESSORS
    course = grading.scratch_course(tmp_path / "course", names=[])  # what hub.setup writes, then appends to
    with open(course / "nbgrader_config.py", "a") as f:
        f.write(hub.INSTRUCTOR_NBGRADER.format(course=course, exchange=tmp_path / "exchange"))
    assert _config(course / "nbgrader_config.py").GenerateFeedback.preprocessors == FEEDBACK_PREPROCESSORS


def test_the_course_config_sets_only_options_nbgrader_reads():
    """A name nbgrader does not know (``Execute.allow_errors``, not a config option) does nothing but warn."""
    from helpers.instructor.execute import CourseExecute

    known = {cls.__name__: cls for cls in (CourseDirectory, Autograde, GenerateFeedback, CourseExecute,
                                           *vars(preprocessors).values()) if isinstance(cls, type)}
    for section, options in _config(grading.REPO / "nbgrader_config.py").items():
        traits = known[section].class_traits(config=True)
        assert set(options) <= set(traits), f"{section}: nbgrader reads no {sorted(set(options) - set(traits))}"
