"""helpers/instructor/learner_outputs.py: the numbers a learner's notebook printed reach the grader of a
written answer, though autograde clears them and runs the notebook again."""

import nbformat
from nbconvert.preprocessors import ClearOutputPreprocessor

from helpers.instructor.learner_outputs import HEADING, SHOWN, TAG, KeepLearnerOutputs, ShowLearnerOutputs


def _submission() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    table = nbformat.v4.new_code_cell("print(table)", outputs=[nbformat.v4.new_output("stream", text="resnet50  1.23x\n")])
    plot = nbformat.v4.new_code_cell("fig = plot()", outputs=[nbformat.v4.new_output("display_data", data={"image/png": "iVBO", "text/plain": "<Figure>"})])
    other = nbformat.v4.new_code_cell("print(secret)", outputs=[nbformat.v4.new_output("stream", text="not for the grader\n")])
    for cell in (table, plot):
        cell.metadata["tags"] = [TAG]
    answer = nbformat.v4.new_markdown_cell("ResNet-50 gains least on my machine.")
    answer.metadata["nbgrader"] = {"solution": True, "grade": True, "grade_id": "written", "points": 4}
    nb.cells = [table, plot, other, nbformat.v4.new_markdown_cell("### Exercise 3"), answer]
    return nb


def _autograde(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The steps in nbgrader's order: keep, clear (as ClearOutput does), run (nothing here), show."""
    nb, _ = KeepLearnerOutputs()(nb, {})   # called as nbgrader calls them: a preprocessor switched off does nothing
    nb, _ = ClearOutputPreprocessor(enabled=True)(nb, {})
    nb, _ = ShowLearnerOutputs()(nb, {})
    return nb


def test_the_tagged_outputs_as_submitted_sit_above_the_written_answer():
    nb = _autograde(_submission())
    shown = [i for i, c in enumerate(nb.cells) if c.metadata.get(SHOWN)]
    assert shown == [4] and nb.cells[5].metadata["nbgrader"]["grade_id"] == "written"
    text = nb.cells[4].source
    assert text.startswith(HEADING) and "resnet50  1.23x" in text and "(a plot)" in text and "`print(table)`" in text
    assert "not for the grader" not in text
    assert not any(c.get("outputs") for c in nb.cells), "the outputs themselves are cleared, as autograde clears them"


def test_a_tagged_cell_the_learner_never_ran_says_so_and_a_notebook_without_a_written_answer_is_left_alone():
    nb = _submission()
    nb.cells[0].outputs = []
    assert "the learner did not run this cell" in _autograde(nb).cells[4].source
    nb = _submission()
    nb.cells = nb.cells[:3]
    assert not any(c.metadata.get(SHOWN) for c in _autograde(nb).cells)
