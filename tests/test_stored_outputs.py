"""nbval's checks on an executed notebook (tests/stored_outputs.py) fail where nbval would."""

import copy

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

import stored_outputs
from helpers.instructor.notebooks import CHECK_TAG


def _source() -> nbformat.NotebookNode:
    checked = new_code_cell("print(len([1, 2, 3]))", metadata={"tags": [CHECK_TAG]}, execution_count=1,
                            outputs=[new_output("stream", name="stdout", text="3\n")])
    shown = new_code_cell("2 + 2", metadata={"tags": [CHECK_TAG]}, execution_count=2,
                          outputs=[new_output("execute_result", data={"text/plain": "4", "image/png": "AAAA"},
                                              execution_count=2)])
    unchecked = new_code_cell("import time; print(time.time())")
    return new_notebook(cells=[checked, shown, unchecked])


def _executed(source):
    executed = copy.deepcopy(source)
    executed.cells[2].outputs = [new_output("stream", name="stdout", text="1764072000.1\n")]
    executed.cells[1].outputs[0]["execution_count"] = 7  # a prompt number is no difference
    executed.cells[1].outputs[0]["data"]["image/png"] = "BBBB"  # nor is a plot's pixels, as in nbval
    executed.cells[0].outputs = [new_output("stream", name="stdout", text="3"), new_output("stream", name="stdout", text="\n")]
    return executed


def test_equal_outputs_pass_and_every_tagged_cell_is_counted():
    source = _source()
    assert stored_outputs.differences(_executed(source), source) == (2, [])
    assert stored_outputs.errors(_executed(source)) == []


def test_a_changed_checked_output_fails_with_both_values():
    source = _source()
    executed = _executed(source)
    executed.cells[1].outputs[0]["data"]["text/plain"] = "5"
    checked, failures = stored_outputs.differences(executed, source)
    assert checked == 2 and len(failures) == 1 and "'4'" in failures[0] and "'5'" in failures[0]


def test_a_missing_output_fails():
    source = _source()
    executed = _executed(source)
    executed.cells[0].outputs = []
    assert len(stored_outputs.differences(executed, source)[1]) == 1


def test_cells_that_do_not_line_up_fail():
    source = _source()
    executed = _executed(source)
    executed.cells.insert(0, new_code_cell("x = 1"))
    assert stored_outputs.differences(executed, source)[1]


def test_a_tagged_cell_without_a_stored_output_fails():
    source = _source()
    source.cells[0].execution_count = None
    assert "make outputs" in stored_outputs.differences(_executed(source), source)[1][0]


def test_an_error_in_any_cell_is_reported():
    executed = _executed(_source())
    executed.cells[2].outputs.append(new_output("error", ename="ZeroDivisionError", evalue="division by zero", traceback=[]))
    found = stored_outputs.errors(executed)
    assert len(found) == 1 and "ZeroDivisionError" in found[0]
