"""helpers/instructor/execute.py: a submission that kills its kernel, loops or eats memory costs only the cells
that did it, on real kernels (the course's, with TVM tuning before the death, and a plain Python one)."""

import time

import nbformat
import pytest

from helpers.instructor.execute import KERNEL_DIED, NOT_RUN, CourseExecute

DEATHS = {
    "a crash": "import os, signal\nos.kill(os.getpid(), signal.SIGABRT)",
    "os._exit": "import os\nos._exit(3)",
    "a segfault in compiled code": "import ctypes\nctypes.string_at(0)",
    "memory exhausted": "hog = []\nwhile True:\n    hog.append(bytearray(10**8))",
}


def _run(sources: list[str], kernel: str = "python3", graded: tuple[int, ...] = (), **options) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    for index in graded:
        nb.cells[index].metadata["nbgrader"] = {"grade": True, "grade_id": f"test_{index}", "points": 1}
    CourseExecute(kernel_name=kernel, **{"timeout": 60, "kernel_memory_gb": 2, **options}).preprocess(
        nb, {"nbgrader": {"student": "ada", "assignment": "day00_environment"}})
    return nb


def _errors(cell) -> list[str]:
    return [o.ename for o in cell.outputs if o.output_type == "error"]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_every_kind_of_death_costs_only_its_cell_and_the_cells_after_it_run_on_the_state_before_it():
    sources = ["answer = 41"]
    for death in DEATHS.values():
        sources += [death, "print(answer + 1)"]
    nb = _run(sources, graded=tuple(range(2, len(sources), 2)))
    for number, name in enumerate(DEATHS):
        dead, after = nb.cells[1 + 2 * number], nb.cells[2 + 2 * number]
        assert _text(after) == "42\n" and not _errors(after), f"after {name}: {after.outputs}"
        if name == "memory exhausted" and _errors(dead) == ["MemoryError"]:
            continue  # under the cap the allocation may fail before the kernel dies: the cell fails either way
        assert KERNEL_DIED in _errors(dead), f"{name}: {dead.outputs}"
        assert "kernel died" in dead.outputs[-1].evalue and "scores nothing" in dead.outputs[-1].evalue


def test_a_death_after_tuning_in_the_course_kernel_leaves_the_tuned_state_for_the_cells_after_it(tmp_path):
    """The course's kernel, as autograde runs a day: MetaSchedule tunes, the kernel dies, the replay tunes again
    into the same database), and the cell after the death finds the database the tuning cell bound."""
    tune = f"""
import torch
from helpers import build, machine, models, tuning
class ConvReLU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
    def forward(self, x):
        return torch.relu(self.conv(x))
torch.manual_seed(0)
model, x = ConvReLU().eval(), torch.randn(1, 3, 16, 16)
imported = models.import_to_relax(model, x)
database = tuning.tune(imported.mod, machine.cpu_target(), {str(tmp_path / 'db')!r}, max_trials_per_task=1, progress=False)
"""
    nb = _run([tune, DEATHS["a segfault in compiled code"], "print((database / 'database_tuning_record.json').stat().st_size > 0)"],
              kernel="tvm-course", graded=(2,), timeout=300)
    assert not _errors(nb.cells[0]), nb.cells[0].outputs
    assert KERNEL_DIED in _errors(nb.cells[1])
    assert _text(nb.cells[2]).split()[-1] == "True", nb.cells[2].outputs


def test_a_loop_says_the_limit_it_ran_past_and_the_notebook_s_cap_stops_the_rest():
    begun = time.monotonic()
    nb = _run(["x = 1", "while True:\n    pass", "print(x)", "import time\ntime.sleep(3)", "print('late')"],
              graded=(2, 4), timeout=2, notebook_timeout=4)
    assert time.monotonic() - begun < 60
    loop = nb.cells[1].outputs[-1]
    assert loop.ename == "CellTimeoutError" and "ran past 2 s" in loop.evalue
    assert _text(nb.cells[2]) == "1\n"
    assert _errors(nb.cells[4]) == [NOT_RUN] and "time limit of 4 s" in nb.cells[4].outputs[0].evalue


@pytest.mark.parametrize("option", ["notebook_timeout", "kernel_memory_gb"])
def test_the_caps_are_settings_of_the_course_s_nbgrader_config(option):
    from pathlib import Path

    config = (Path(__file__).resolve().parent.parent / "nbgrader_config.py").read_text()
    assert f"c.CourseExecute.{option}" in config
