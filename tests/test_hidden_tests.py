"""The tests of graded exercises catch the wrong answers they are written against.

A test cell of a source notebook (visible and hidden tests, as the autograder runs it) is executed
here on a known wrong answer and must fail; where it matters, its hidden part alone must fail it,
after the visible part passed on the right answer. The grading gate (test_course_notebooks.py)
already checks that the solutions score full marks.
"""

import json
import os
import runpy
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
import tvm

from helpers import build, export, gpu, grading, models, timing

HIDDEN = "### BEGIN HIDDEN TESTS"


def _cell(day: str, grade_id: str) -> str:
    nb = nbformat.read(grading.REPO / grading.SOURCE / day / f"{day}.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    return cell.source


def _parts(day: str, grade_id: str) -> tuple[str, str]:
    """(visible tests, hidden tests) of a test cell."""
    source = _cell(day, grade_id)
    assert HIDDEN in source, f"{day}/{grade_id} has no hidden tests"
    visible, hidden = source.split(HIDDEN, 1)
    return visible, hidden


# ---------------------------------------------------------------- Day 9: timing an asynchronous device

def _time_async_without_warmup_sync(launch, sync, repeats=20, warmup=3):
    """Warms up but does not wait for the warm-up work: it lands in the first timed call."""
    for _ in range(warmup):
        launch()
    (result,) = timing.measure({"call": launch}, warmup=0, repeats=repeats, sync=sync)
    return float(result.median_ms)


def test_day09_solution_passes_visible_and_hidden_tests():
    namespace = {"gpu": gpu, "timing": timing}
    exec(_cell("day09_gpu", "time_async"), namespace)
    exec(_cell("day09_gpu", "test_time_async"), namespace)


def test_day09_hidden_tests_catch_a_missing_sync_after_the_warmup():
    visible, hidden = _parts("day09_gpu", "test_time_async")
    namespace = {"gpu": gpu, "timing": timing, "time_async": _time_async_without_warmup_sync}
    exec(visible, namespace)  # the visible tests cannot see it: one slow sample does not move a median
    with pytest.raises(AssertionError, match="sync\\(\\) after the warm-up"):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 6: export, reload in a fresh process

def _exported_here(model, example, workdir):
    """The artefact written as the exercise asks, compiled and run in this process."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    imported = models.import_to_relax(model, example)
    compiled = build.compile_model(imported)
    here = compiled(example)
    compiled.executable.export_library(str(workdir / export.LIBRARY))
    export.save_params(imported, workdir / export.PARAMS)
    np.save(workdir / export.INPUT, example.detach().numpy())
    export.write_loader(workdir)
    return here


def _in_process_output(model, example, workdir):
    """Wrong: output.npy saved from this process; no fresh process at all."""
    here = _exported_here(model, example, workdir)
    np.save(Path(workdir) / export.OUTPUT, here)
    return 0.0


def _loader_run_in_process(model, example, workdir):
    """Wrong: the loader's own code, run inside this process instead of a fresh one."""
    here = _exported_here(model, example, workdir)
    runpy.run_path(str(Path(workdir) / export.LOADER))["run"](Path(workdir))
    return float(np.abs(np.load(Path(workdir) / export.OUTPUT) - here).max())


def _day06_namespace(**extra) -> dict:
    names = dict(json=json, os=os, shutil=shutil, tempfile=tempfile, time=time, Path=Path, np=np, torch=torch,
                 tvm=tvm, build=build, export=export, models=models)
    return names | extra


@pytest.mark.parametrize("wrong", [_in_process_output, _loader_run_in_process])
def test_day06_an_output_not_made_by_a_fresh_process_fails(wrong):
    namespace = _day06_namespace(export_and_reload=wrong)
    with pytest.raises(AssertionError, match="fresh"):
        exec(_cell("day06_export", "test_export_and_reload"), namespace)


def test_day06_hidden_tests_alone_catch_an_in_process_output():
    visible, hidden = _parts("day06_export", "test_export_and_reload")
    namespace = _day06_namespace()
    exec(_cell("day06_export", "export_and_reload"), namespace)
    exec(visible, namespace)  # the right answer passes the visible tests and defines their checks
    namespace["export_and_reload"] = _in_process_output
    with pytest.raises(AssertionError, match="did not run during this call"):
        exec(hidden, namespace)
