"""The grading gate's probe (tests/blank_probe.py) catches a test cell that passes on the blank, and
leaves the solution's run as it was."""

import nbformat
import pytest

import blank_probe
from helpers.instructor import grading

DAY = "day98_probe"


def _meta(**kw):
    return {"nbgrader": {"schema_version": 3, "task": False, **kw}}


def _source() -> nbformat.NotebookNode:
    """Two exercises: the first's tests fail on the blank, the second's test (planted) cannot fail."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "tvm-course", "display_name": "TVM course (Python 3.11)", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Day 98 — probe\n\n### Exercise 1 (2 points): the answer"),
        nbformat.v4.new_code_cell("def answer():\n    ### BEGIN SOLUTION\n    return 42\n    ### END SOLUTION",
                                  metadata=_meta(grade=False, grade_id="answer", locked=False, solution=True)),
        nbformat.v4.new_code_cell("doubled = 2 * answer()"),
        nbformat.v4.new_code_cell("assert callable(answer)\n### BEGIN HIDDEN TESTS\nassert doubled == 84, 'twice the answer'\n### END HIDDEN TESTS",
                                  metadata=_meta(grade=True, grade_id="test_answer", locked=True, points=2, solution=False)),
        nbformat.v4.new_markdown_cell("### Exercise 2 (1 point): a constant"),
        nbformat.v4.new_code_cell("### BEGIN SOLUTION\nconstant = 7\n### END SOLUTION",
                                  metadata=_meta(grade=False, grade_id="constant", locked=False, solution=True)),
        nbformat.v4.new_code_cell("assert True  # planted: a test that cannot fail",
                                  metadata=_meta(grade=True, grade_id="test_constant", locked=True, points=1, solution=False)),
        nbformat.v4.new_markdown_cell("## After the exercises"),
        nbformat.v4.new_code_cell("print('after:', answer(), doubled, constant)"),
    ]
    return nb


def test_bound_names_are_the_top_level_bindings_only():
    source = ("import numpy as np\nfrom a import b as c\nx, y = 1, 2\nfor i in range(3):\n    z = i\n"
              "def f():\n    local = 1\nclass K:\n    attr = 2\nw = [j for j in range(2)]\nwith open('f') as fh:\n    pass")
    assert blank_probe.bound_names(source) == {"np", "c", "x", "y", "i", "z", "f", "K", "w", "fh"}
    assert blank_probe.bound_names("%timeit f()") == set()


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    course = tmp_path_factory.mktemp("probe")
    (course / grading.SOURCE / DAY).mkdir(parents=True)
    (course / "nbgrader_config.py").write_text((grading.REPO / "nbgrader_config.py").read_text())
    nbformat.write(_source(), course / grading.SOURCE / DAY / f"{DAY}.ipynb")
    grading.generate(DAY, course)
    source = nbformat.read(course / grading.SOURCE / DAY / f"{DAY}.ipynb", as_version=4)
    student = nbformat.read(course / grading.RELEASE / DAY / f"{DAY}.ipynb", as_version=4)
    submission = course / "incoming.ipynb"
    nbformat.write(blank_probe.with_probes(source, student), submission)
    grading.submit(course, DAY, "solution", submission)
    grading.autograde(DAY, course, student="solution", cell_timeout=60)
    executed = nbformat.read(course / "autograded" / "solution" / DAY / f"{DAY}.ipynb", as_version=4)
    return course, source, executed


def test_the_probe_catches_the_planted_test_and_only_it(probed):
    course, _, executed = probed
    passing = blank_probe.tests_passing_on_the_blank(executed)
    assert len(passing) == 1 and passing[0].startswith("test_constant"), passing
    assert blank_probe.probed_test_count(executed) == 2
    assert blank_probe.probes_that_broke(executed) == []
    score = grading.scores(DAY, course)["solution"]
    assert score.score == score.max_score == 3, "the probes must not cost the solution a point"


def test_the_solution_runs_on_after_the_probe_as_before_it(probed):
    _, source, executed = probed
    clean = blank_probe.without_probes(executed)
    assert [c.source for c in clean.cells] == [c.source for c in source.cells]
    last = "".join(o.get("text", "") for o in clean.cells[-1].outputs)
    assert last == "after: 42 84 7\n", f"the names the probe removed or replaced were not restored: {last!r}"
    stub_runs = [c for c in executed.cells if c.metadata.get(blank_probe.PROBE, {}).get("role") == "stub"]
    assert stub_runs and all("NotImplementedError" in c.source for c in stub_runs), "the stubs come from the student version"
