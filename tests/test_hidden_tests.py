"""The tests of graded exercises catch the wrong answers they are written against.

A test cell of a source notebook (visible and hidden tests, as the autograder runs it) is executed
here on a known wrong answer and must fail; where it matters, its hidden part alone must fail it,
after the visible part passed on the right answer. The grading gate (test_course_notebooks.py)
already checks that the solutions score full marks.
"""

import importlib.util
import inspect
import json
import linecache
import os
import runpy
import shutil
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import nbformat
import numpy as np
import pandas as pd
import pytest
import torch
import tvm

from helpers import build, export, gpu, int8, ir, machine, models, profiling, quantize, timing
from helpers.instructor import grading

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


# ---------------------------------------------------------------- Day 0: float32 lanes from a target's features

DAY00 = "day00_environment"


def _day00_namespace(**extra) -> dict:
    return dict(tvm=tvm, machine=machine, target=machine.cpu_target()) | extra


def test_day00_solution_passes_visible_and_hidden_tests():
    namespace = _day00_namespace()
    exec(_cell(DAY00, "float32_lanes"), namespace)
    exec(_cell(DAY00, "test_float32_lanes"), namespace)


def test_day00_peak_passes_its_tests_and_a_call_of_the_courses_own_fails_the_visible_one():
    namespace = _day00_namespace()
    exec(_cell(DAY00, "peak_gflops"), namespace)
    exec(_cell(DAY00, "test_peak_gflops"), namespace)
    from helpers import kernels

    borrowed = kernels.peak_gflops   # however it is reached: here through a name of the learner's own

    def peak_gflops(cores, ghz, fp32_lanes, fma_units):
        return borrowed(cores, ghz, fp32_lanes, fma_units)

    visible, _ = _parts(DAY00, "test_peak_gflops")
    with pytest.raises(AssertionError, match="write the formula yourself"):
        exec(visible, _day00_namespace(peak_gflops=peak_gflops))


def _lanes_by_avx2(target) -> int:
    """Keyed on AVX2 instead of AVX: a Sandy Bridge's 256-bit registers go unseen."""
    features = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target)}
    return 16 if "avx512f" in features else 8 if "avx2" in features else 4


def _lanes_by_name(target) -> int:
    """Reads the features of the CPU the target names, not of the target: a feature it switches off still counts."""
    named = tvm.target.Target({"kind": "llvm", "mcpu": str(target.attrs["mcpu"]),
                               **({"mtriple": str(target.attrs["mtriple"])} if "mtriple" in target.attrs else {})})
    return _lanes_x86_and_arm(named)


def _lanes_x86_and_arm(target) -> int:
    features = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target)}
    return 16 if "avx512f" in features else 8 if "avx" in features else 4 if features & {"sse2", "neon"} else 1


def _lanes_x86_only(target) -> int:
    """Knows x86's features only: an ARM CPU's NEON is taken for scalar code."""
    features = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target)}
    return 16 if "avx512f" in features else 8 if "avx" in features else 4 if "sse2" in features else 1


@pytest.mark.parametrize("wrong", [_lanes_by_avx2, _lanes_by_name, _lanes_x86_only])
def test_day00_hidden_tests_alone_catch_lanes_keyed_on_avx2_on_the_name_or_on_x86_only(wrong):
    visible, hidden = _parts(DAY00, "test_float32_lanes")
    namespace = _day00_namespace(float32_lanes=wrong)
    exec(visible, namespace)  # this CPU, haswell and skylake-avx512: the visible test cannot tell
    with pytest.raises(AssertionError, match="float32 lanes"):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 3: the passes the VirtualMachine cannot do without

DAY03 = "day03_build"
DAY03_NEEDED = ("LegalizeOps", "CallTIRRewrite", "LowerAllocTensor", "LowerRuntimeBuiltin", "AttachGlobalSymbol")


def _day03_namespace(**extra) -> dict:
    """The names the exercise's cells use, ``ALL_PASSES`` and ``quietly`` from the notebook's own cell."""
    from tvm import relax

    torch.manual_seed(0)
    small = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    namespace = dict(np=np, torch=torch, tvm=tvm, relax=relax, build=build, machine=machine, models=models,
                     target=machine.cpu_target(), imported=models.import_to_relax(small, torch.randn(1, 3, 6, 6)))
    nb = nbformat.read(grading.REPO / grading.SOURCE / DAY03 / f"{DAY03}.ipynb", as_version=4)
    exec(next(c.source for c in nb.cells if c.get("id") == "all-passes"), namespace)
    return namespace | extra


def _passes_named(*names):
    """A lowering_passes that returns the CPU pipeline's passes of these names, in the order given."""
    def lowering_passes(target):
        from tvm.relax.backend import cpu_generic

        every = {p.info.name: p for p in (cpu_generic.library_dispatch_passes(target) + cpu_generic.legalize_passes(target)
                                          + cpu_generic.pipeline.dataflow_lower_passes(target)
                                          + cpu_generic.finalize_passes(target))}
        return [every[n] for n in names]
    return lowering_passes


def test_day03_the_passes_the_vm_needs_pass_visible_and_hidden_tests():
    """The right answer, given directly (the gate proves the solution's experiment finds it)."""
    namespace = _day03_namespace(lowering_passes=_passes_named(*DAY03_NEEDED))
    exec(_cell(DAY03, "test_lowering_passes_build"), namespace)
    exec(_cell(DAY03, "test_lowering_passes_minimal"), namespace)


@pytest.mark.parametrize("wrong, message", [
    (DAY03_NEEDED[:-1], "cannot|must be called"),   # a lowering pass missing: the build fails
    (("CallTIRRewrite", "LegalizeOps") + DAY03_NEEDED[2:], "keep the pipeline's order"),
    (DAY03_NEEDED + ("FuseOps",), "not passes of the CPU pipeline|keep the pipeline's order"),
])
def test_day03_build_tests_catch_a_missing_pass_and_a_wrong_order(wrong, message):
    with pytest.raises(Exception, match=message):
        exec(_cell(DAY03, "test_lowering_passes_build"), _day03_namespace(lowering_passes=_passes_named(*wrong)))


def test_day03_minimal_tests_catch_an_optimisation_kept():
    wrong = ("LegalizeOps", "CallTIRRewrite", "StaticPlanBlockMemory", "LowerAllocTensor", "LowerRuntimeBuiltin",
             "AttachGlobalSymbol")
    namespace = _day03_namespace(lowering_passes=_passes_named(*wrong))
    exec(_cell(DAY03, "test_lowering_passes_build"), namespace)   # it builds: only the second test can tell
    with pytest.raises(AssertionError, match=r"without \['StaticPlanBlockMemory'\]"):
        exec(_cell(DAY03, "test_lowering_passes_minimal"), namespace)


# ---------------------------------------------------------------- Day 9: timing an asynchronous device

def _time_async_without_warmup_sync(launch, sync, repeats=20, warmup=3):
    """Warms up but does not wait for the warm-up work: it lands in the first timed call."""
    for _ in range(warmup):
        launch()
    (result,) = timing.measure({"call": launch}, warmup=0, repeats=repeats, sync=sync)
    return float(result.median_ms)


def test_day09_solution_passes_visible_and_hidden_tests():
    import statistics

    namespace = {"gpu": gpu, "timing": timing, "time": time, "statistics": statistics}
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


# ---------------------------------------------------------------- Day 2: a pass folding chains of constants

def _exec_with_source(source: str, namespace: dict, name: str) -> None:
    """exec() with the source visible to ``inspect``, as in a notebook: TVMScript's parser reads it."""
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)


def _day02_namespace() -> dict:
    return dict(np=np, torch=torch, tvm=tvm, relax=tvm.relax, build=build, ir=ir, models=models,
                target=machine.cpu_target())


def _day02_pass_with(old: str, new: str) -> str:
    """The model answer with one deliberate mistake."""
    source = _cell("day02_optimize", "fold_constant_chains")
    assert old in source, f"the model answer changed: {old!r} is gone"
    return source.replace(old, new)


DAY02_PASSES_ONLY_HIDDEN_TESTS_CATCH = {
    # a + x is missed: only a constant on the right is seen (torch.export puts constants on the right)
    "constant on the right only": (
        "if isinstance(lhs, tvm.ir.Constant) and not isinstance(rhs, tvm.ir.Constant):", "if False:"),
    # helper functions are left alone
    "main only": ("if isinstance(func, relax.Function):\n            folder", 'if gv.name_hint == "main":\n            folder'),
}


def test_day02_solution_passes_visible_and_hidden_tests():
    namespace = _day02_namespace()
    exec(_cell("day02_optimize", "fold_constant_chains"), namespace)
    _exec_with_source(_cell("day02_optimize", "test_fold_constant_chains"), namespace, "day02-tests")


def test_day02_tests_catch_a_pass_that_mixes_add_and_multiply():
    namespace = _day02_namespace()
    exec(_day02_pass_with("inner.op.same_as(call.op)", "inner.op.name in combine"), namespace)  # (x + a) * b as (x * a) * b
    with pytest.raises(AssertionError, match="compute what the original did|should become one"):
        _exec_with_source(_cell("day02_optimize", "test_fold_constant_chains"), namespace, "day02-tests")


@pytest.mark.parametrize("mistake", DAY02_PASSES_ONLY_HIDDEN_TESTS_CATCH)
def test_day02_hidden_tests_catch_a_pass_that_misses_chains(mistake):
    visible, hidden = _parts("day02_optimize", "test_fold_constant_chains")
    namespace = _day02_namespace()
    exec(_day02_pass_with(*DAY02_PASSES_ONLY_HIDDEN_TESTS_CATCH[mistake]), namespace)
    _exec_with_source(visible, namespace, "day02-visible")  # the visible test (a model from torch.export) cannot tell
    with pytest.raises(AssertionError, match="one add|must fold too"):
        _exec_with_source(hidden, namespace, "day02-hidden")


# ---------------------------------------------------------------- Day 5: an instrument hook of one's own

def _kernels_seen_once(compiled, x):
    """Records each kernel the hook sees, but not how often: right only where every kernel runs once."""
    seen = {}

    def hook(func, name, before_run, ret_value, *args):
        if before_run and not name.startswith(profiling.BUILTIN_PREFIX):
            seen[name] = 1
        return 0

    compiled.vm.set_instrument(hook)
    try:
        compiled(x)
    finally:
        compiled.vm.set_instrument(None)
    return seen


def _day05_namespace(**extra) -> dict:
    small = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    x_small = torch.randn(1, 3, 16, 16)
    names = dict(torch=torch, build=build, models=models, profiling=profiling, x_small=x_small,
                 small_compiled=build.compile_model(models.import_to_relax(small, x_small)))
    return names | extra


def test_day05_solution_passes_visible_and_hidden_tests():
    namespace = _day05_namespace()
    exec(_cell("day05_profile", "kernel_calls"), namespace)
    exec(_cell("day05_profile", "test_kernel_calls"), namespace)


def test_day05_visible_tests_catch_a_hook_left_installed():
    source = _cell("day05_profile", "kernel_calls").replace("compiled.vm.set_instrument(None)", "pass")
    namespace = _day05_namespace()
    exec(source, namespace)
    with pytest.raises(AssertionError, match="remove it afterwards"):
        exec(_cell("day05_profile", "test_kernel_calls"), namespace)


def test_day05_hidden_tests_alone_catch_counts_that_ignore_repeated_calls():
    visible, hidden = _parts("day05_profile", "test_kernel_calls")
    namespace = _day05_namespace(kernel_calls=_kernels_seen_once)
    exec(visible, namespace)  # every kernel of the small network runs once
    with pytest.raises(AssertionError, match="expected"):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 11: the speedup chart, drawn any sensible way

def _horizontal_speedups(table, title="Tuned TVM over eager PyTorch"):
    """A right answer drawn differently: horizontal bars with labels, a legend and a grid."""
    fig, ax = plt.subplots()
    bars = ax.barh(table.model, table.speedup, label="speedup")
    ax.bar_label(bars, fmt="%.1fx")
    ax.axvline(1.0, color="black", linestyle=":", label="parity")
    ax.legend()
    ax.grid(True)
    ax.set_xlabel("speedup")
    fig.suptitle(title)
    return fig


def _ascending_speedups(table, title="t"):
    """Wrong: the bars in ascending order, not the table's."""
    fig, ax = plt.subplots()
    ordered = table.sort_values("speedup")
    ax.bar(ordered.model, ordered.speedup)
    ax.axhline(1.0)
    ax.set_ylabel("speedup")
    ax.set_title(title)
    return fig


def _without_parity(table, title="t"):
    fig, ax = plt.subplots()
    ax.bar(table.model, table.speedup)
    ax.set_ylabel("speedup")
    ax.set_title(title)
    return fig


def _day11_namespace(plot) -> dict:
    table = pd.DataFrame({"model": ["m1", "m2", "m3"], "baseline_ms": [2.0, 3.0, 1.0],
                          "candidate_ms": [1.0, 2.0, 2.0], "speedup": [2.0, 1.5, 0.5]})
    return dict(plt=plt, pd=pd, zoo_table=table, plot_speedups_by_model=plot)


def test_day11_plot_test_passes_a_right_chart_drawn_differently():
    exec(_cell("day11_capstone", "test_plot_speedups_by_model"), _day11_namespace(_horizontal_speedups))


@pytest.mark.parametrize("wrong, message", [(_ascending_speedups, "in the table's order"), (_without_parity, "line at 1")])
def test_day11_plot_test_catches_a_wrong_chart(wrong, message):
    with pytest.raises(AssertionError, match=message):
        exec(_cell("day11_capstone", "test_plot_speedups_by_model"), _day11_namespace(wrong))


# ---------------------------------------------------------------- Day 4: is a difference bigger than the noise?

def _quartiles_apart(baseline, candidate):
    """The interquartile ranges do not overlap: safe, but it misses many real wins."""
    return bool(candidate.q3_ms < baseline.q1_ms)


def _medians_only(baseline, candidate):
    """A lower median, however small the difference: a false alarm every other time."""
    return bool(candidate.median_ms < baseline.median_ms)


def _over_a_fixed_time(baseline, candidate):
    """Faster by a fixed 0.6 ms: right for runs of about 10 ms only."""
    return bool(baseline.median_ms - candidate.median_ms > 0.6)


def _day04_namespace(**extra) -> dict:
    return {"timing": timing, "np": np} | extra


def test_day04_solution_passes_visible_and_hidden_tests():
    namespace = _day04_namespace()
    exec(_cell("day04_benchmark", "clearly_faster"), namespace)
    exec(_cell("day04_benchmark", "test_clearly_faster"), namespace)


@pytest.mark.parametrize("wrong, message", [(_quartiles_apart, "found in only"), (_medians_only, "called different")])
def test_day04_tests_catch_a_rule_that_misses_wins_and_one_that_cries_wolf(wrong, message):
    with pytest.raises(AssertionError, match=message):
        exec(_cell("day04_benchmark", "test_clearly_faster"), _day04_namespace(clearly_faster=wrong))


def test_day04_hidden_tests_alone_catch_a_threshold_in_milliseconds():
    visible, hidden = _parts("day04_benchmark", "test_clearly_faster")
    namespace = _day04_namespace(clearly_faster=_over_a_fixed_time)
    exec(visible, namespace)  # runs of about 10 ms: the visible test cannot tell
    with pytest.raises(AssertionError, match="scaled by"):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 4: one import for every batch size

def _day04_import_namespace(**extra) -> dict:
    from helpers import dynamic

    return {"torch": torch, "tvm": tvm, "build": build, "dynamic": dynamic} | extra


def _any_batch(model, example, max_batch, trace=None, dim=None, weights_as_inputs=True):
    """An import with a symbolic batch, right unless told otherwise."""
    from tvm.relax.frontend.torch import from_exported_program

    from helpers import dynamic

    if max_batch < 2:
        raise ValueError(f"max_batch {max_batch} is below 2")
    trace = example[:1].expand(2, *example.shape[1:]).contiguous() if trace is None else trace
    dim = torch.export.Dim("batch", min=1, max=max_batch) if dim is None else dim
    exported = torch.export.export(model.eval(), (trace,), dynamic_shapes=({0: dim},))
    if weights_as_inputs:
        mod, weights = tvm.relax.frontend.detach_params(from_exported_program(exported, keep_params_as_input=True))
        params = weights["main"]
    else:
        mod, params = from_exported_program(exported), []
    return dynamic.DynamicImport(mod=mod, params=params, input_shape=tuple(example.shape), input_dtype="float32",
                                 max_batch=max_batch)


def _traced_as_given(model, example, max_batch):
    """Traces the example itself: fine for a batch of 3, refused by torch.export for a batch of 1."""
    return _any_batch(model, example, max_batch, trace=example)


def _no_range(model, example, max_batch):
    """A Dim without its range: any batch is allowed in the module, max_batch is not recorded."""
    return _any_batch(model, example, max_batch, dim=torch.export.Dim("batch"))


def _weights_inside(model, example, max_batch):
    """The weights left as constants in the module: it runs, but they are not split off."""
    return _any_batch(model, example, max_batch, weights_as_inputs=False)


def test_day04_any_batch_solution_passes_visible_and_hidden_tests():
    namespace = _day04_import_namespace()
    exec(_cell("day04_benchmark", "import_any_batch"), namespace)
    exec(_cell("day04_benchmark", "test_import_any_batch"), namespace)


@pytest.mark.parametrize("wrong, message", [
    (_traced_as_given, "specialized it to be a constant"),
    (_no_range, "range recorded in the module"),
    (_weights_inside, "weights should be inputs of main"),
])
def test_day04_hidden_tests_alone_catch_a_batch_of_one_no_range_and_weights_left_inside(wrong, message):
    visible, hidden = _parts("day04_benchmark", "test_import_any_batch")
    namespace = _day04_import_namespace(import_any_batch=wrong)
    exec(visible, namespace)  # a convnet traced from a batch of 3, checked at batches 1, 3 and 6
    with pytest.raises(Exception, match=message):
        exec(hidden, namespace)


def _the_courses_helper(model, example, max_batch):
    """Section 3's helper called instead of an import of one's own."""
    from helpers import dynamic

    return dynamic.import_dynamic_batch(model, example, max_batch)


def test_day04_visible_test_catches_the_courses_helper_called():
    with pytest.raises(AssertionError, match="make the import itself"):
        exec(_cell("day04_benchmark", "test_import_any_batch"), _day04_import_namespace(import_any_batch=_the_courses_helper))


# ---------------------------------------------------------------- Day 6: an artefact for CPUs other than yours

def _export_for_this_cpu(imported, folder, mcpu):
    """Wrong: ignores mcpu and builds for this machine's CPU."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with export.capture_stderr():
        build.compile_model(imported).executable.export_library(str(folder / "model.so"))
    return folder / "model.so"


def test_day06_portable_export_solution_passes_visible_and_hidden_tests():
    namespace = _day06_namespace(relax=tvm.relax, machine=machine)
    exec(_cell("day06_export", "export_for_cpu"), namespace)
    exec(_cell("day06_export", "test_export_for_cpu"), namespace)


def test_day06_an_export_for_this_cpu_is_caught():
    namespace = _day06_namespace(relax=tvm.relax, machine=machine, export_for_cpu=_export_for_this_cpu)
    with pytest.raises(AssertionError, match="built for this CPU"):
        exec(_cell("day06_export", "test_export_for_cpu"), namespace)


# ---------------------------------------------------------------- Day 10: a torch.compile backend of one's own

def _ops_of_the_first_input_only(model, *inputs):
    """Wrong: calls the model on its first input only, right for every one-input model."""
    histograms = []

    def backend(gm, example_inputs):
        mod, _ = models.to_relax(torch.export.export(gm, tuple(example_inputs)))
        histograms.append(dict(ir.op_histogram(mod)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(inputs[0])
    return histograms


def _day10_namespace(**extra) -> dict:
    from helpers import dynamo

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))

    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encode, self.head = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

        def forward(self, x):
            h = self.encode(x)
            h = torch.relu(h) * 2 if h.mean() > 0 else torch.sigmoid(h)
            return self.head(h)

    names = dict(torch=torch, ir=ir, models=models, dynamo=dynamo, small=Small().eval(), small_x=torch.randn(1, 3, 8, 8),
                 gated=Gated().eval(), gx=torch.randn(4, 16))
    return names | extra


def test_day10_solution_passes_visible_and_hidden_tests():
    namespace = _day10_namespace()
    exec(_cell("day10_torch_compile", "relax_ops_per_graph"), namespace)
    exec(_cell("day10_torch_compile", "test_relax_ops_per_graph"), namespace)


def test_day10_hidden_tests_alone_catch_a_backend_run_on_the_first_input_only():
    visible, hidden = _parts("day10_torch_compile", "test_relax_ops_per_graph")
    namespace = _day10_namespace(relax_ops_per_graph=_ops_of_the_first_input_only)
    exec(visible, namespace)  # both visible models take one input
    with pytest.raises(TypeError, match="argument"):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 13: operators, rewrites, dispatch

DAY13 = "day13_dispatch"


def _day13_namespace(**extra) -> dict:
    import tvm_ffi
    from tvm import relax, te, topi
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    from helpers import dispatch, ir, machine

    names = dict(np=np, torch=torch, tvm=tvm, tvm_ffi=tvm_ffi, relax=relax, te=te, topi=topi, is_op=is_op, wildcard=wildcard,
                 rewrite_call=rewrite_call, build=build, dispatch=dispatch, ir=ir, models=models,
                 target=machine.cpu_target())
    return names | extra


def _dwconv(clip_high: bool = True, use_stride: bool = True, use_bias: bool = True):
    """A TE depthwise conv + bias + ReLU6 with one mistake switched on."""
    from tvm import te, topi

    def dwconv_bias_relu6(data, weight, bias, stride, padding):
        stride = stride if use_stride else 1
        n, c, h, w = data.shape
        _, _, kh, kw = weight.shape
        padded = topi.nn.pad(data, [0, 0, padding, padding])
        oh, ow = (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1
        ry, rx = te.reduce_axis((0, kh)), te.reduce_axis((0, kw))
        conv = te.compute((n, c, oh, ow), lambda b, ch, i, j: te.sum(
            padded[b, ch, i * stride + ry, j * stride + rx] * weight[ch, 0, ry, rx], axis=[ry, rx]))
        zero, six = tvm.tirx.const(0.0, "float32"), tvm.tirx.const(6.0 if clip_high else 1e30, "float32")
        return te.compute(conv.shape, lambda b, ch, i, j: te.min(te.max(conv[b, ch, i, j] + (bias[ch] if use_bias else zero), zero), six))

    return dwconv_bias_relu6


def test_day13_solutions_pass_their_tests():
    for solution, tests in [("dwconv_bias_relu6", "test_dwconv_bias_relu6"), ("offload_conv_bias_relu", "test_offload_conv_bias_relu"),
                            ("offload_linear", "test_offload_linear")]:
        namespace = _day13_namespace()
        exec(_cell(DAY13, solution), namespace)
        exec(_cell(DAY13, tests), namespace)


@pytest.mark.parametrize("mistake", [dict(clip_high=False), dict(use_bias=False), dict(use_stride=False)])
def test_day13_operator_tests_catch_wrong_operators(mistake):
    with pytest.raises(AssertionError, match="relative error|output"):
        exec(_cell(DAY13, "test_dwconv_bias_relu6"), _day13_namespace(dwconv_bias_relu6=_dwconv(**mistake)))


def test_day13_hidden_operator_tests_alone_catch_an_ignored_stride():
    visible, hidden = _parts(DAY13, "test_dwconv_bias_relu6")
    namespace = _day13_namespace(dwconv_bias_relu6=_dwconv(use_stride=False))
    exec(visible, namespace)  # stride 1 only: the visible test cannot tell
    with pytest.raises(AssertionError, match="stride 2"):
        exec(hidden, namespace)


def _offload(check_groups: bool = True, attrs=None, need_relu: bool = True, any_add: bool = False):
    """An offload_conv_bias_relu with one mistake: every conv taken, fixed attributes, no ReLU required, or
    any add after the convolution taken for its bias (a residual's too)."""
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    from helpers import dispatch

    def offload_conv_bias_relu(mod):
        conv, bias = is_op("relax.nn.conv2d")(wildcard(), wildcard()), wildcard()
        added = is_op("relax.add")(conv, bias if any_add else is_op("relax.reshape")(bias, wildcard()))
        pattern = is_op("relax.nn.relu")(added) if need_relu else added

        def rewrite(expr, found):
            call = found[conv]
            packed = dispatch.conv_attrs(call)
            if packed is None and check_groups:
                return expr
            packed = relax.ShapeExpr(attrs) if attrs is not None else (packed or relax.ShapeExpr([1, 1, 1, 1, 1, 1]))
            vector = found[bias]
            if any_add and isinstance(vector, relax.Call) and vector.op.name == "relax.reshape":
                vector = vector.args[0]  # a bias's reshape undone; anything else taken as it is
            return relax.call_dps_packed("course.torch.conv2d_bias_relu",
                                         relax.Tuple([call.args[0], call.args[1], vector, packed]),
                                         out_ty=relax.TensorType(call.ty.shape, call.ty.dtype))

        new = mod.clone()
        new["main"] = rewrite_call(pattern, rewrite, mod["main"])
        return new

    return offload_conv_bias_relu


@pytest.mark.parametrize("mistake", [dict(check_groups=False), dict(need_relu=False), dict(attrs=[1, 1, 1, 1, 1, 1]),
                                     dict(any_add=True)])
def test_day13_rewrite_tests_catch_wrong_rewrites(mistake):
    with pytest.raises(AssertionError):  # a count, or a parity error (the library refusing a depthwise weight)
        exec(_cell(DAY13, "test_offload_conv_bias_relu"), _day13_namespace(offload_conv_bias_relu=_offload(**mistake)))


@pytest.mark.parametrize("mistake, message", [(dict(attrs=[1, 1, 1, 1, 1, 1]), "output buffer"),
                                              (dict(any_add=True), "expected 1 calls")])
def test_day13_hidden_rewrite_tests_alone_catch_fixed_attributes_and_a_residual_taken_for_a_bias(mistake, message):
    visible, hidden = _parts(DAY13, "test_offload_conv_bias_relu")
    namespace = _day13_namespace(offload_conv_bias_relu=_offload(**mistake))
    exec(visible, namespace)  # the visible model has stride 1, padding 1 only, and no residual connection
    with pytest.raises(AssertionError, match=message):  # the library's error, re-raised by TVM's FFI, is in the message
        exec(hidden, namespace)


def _linear(write_out: bool = True, any_matmul: bool = False, batch_one: bool = False, with_bias: bool = True):
    """Exercise 3's two halves with one mistake: a result returned instead of written, any matmul + add
    taken (a plain ``x @ W`` read as a transposed weight), the visible batch of 1 built into the output
    type, or the bias left out of the call."""
    import tvm_ffi
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    @tvm_ffi.register_global_func("day13.linear", override=True)
    def day13_linear(*args):
        x, weight, out = (torch.from_dlpack(a) for a in (args[0], args[1], args[-1]))
        bias = torch.from_dlpack(args[2]) if with_bias else torch.zeros(weight.shape[0])
        result = torch.addmm(bias, x, weight.t())
        if not write_out:
            return result
        out.copy_(result)

    def offload_linear(mod):
        x, weight, bias = wildcard(), wildcard(), wildcard()
        matmul = is_op("relax.matmul")(x, weight if any_matmul else is_op("relax.permute_dims")(weight))
        pattern = is_op("relax.add")(matmul, bias) if with_bias else matmul

        def rewrite(expr, found):
            w = found[weight]
            if isinstance(w, relax.Call) and w.op.same_as(tvm.ir.Op.get("relax.permute_dims")):
                w = w.args[0]
            shape = (1, expr.ty.shape[1]) if batch_one else expr.ty.shape
            args = [found[x], w] + ([found[bias]] if with_bias else [])
            return relax.call_dps_packed("day13.linear", relax.Tuple(args), out_ty=relax.TensorType(shape, expr.ty.dtype))

        new = mod.clone()
        new["main"] = rewrite_call(pattern, rewrite, mod["main"])
        return new

    return offload_linear


@pytest.mark.parametrize("mistake", [dict(write_out=False), dict(with_bias=False), dict(any_matmul=True), dict(batch_one=True)])
def test_day13_library_function_tests_catch_wrong_offloads(mistake):
    with pytest.raises(Exception):  # a count, a parity error, or PyTorch refusing an output of the wrong shape
        exec(_cell(DAY13, "test_offload_linear"), _day13_namespace(offload_linear=_linear(**mistake)))


@pytest.mark.parametrize("mistake, message", [(dict(any_matmul=True), "expected 1 calls"), (dict(batch_one=True), "Reshape expects")])
def test_day13_hidden_library_function_tests_alone_catch_a_plain_matmul_and_a_built_in_batch(mistake, message):
    visible, hidden = _parts(DAY13, "test_offload_linear")
    namespace = _day13_namespace(offload_linear=_linear(**mistake))
    exec(visible, namespace)  # Linears only, batch 1: the visible test cannot tell
    with pytest.raises(Exception, match=message):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 7: a layout change with its padding, in TE

DAY07 = "day07_layouts"


def _day07_namespace(**extra) -> dict:
    from tvm import te

    from helpers import kernels

    target = machine.cpu_target()
    return dict(np=np, tvm=tvm, te=te, kernels=kernels, target=target, LANES=kernels.float32_lanes(target)) | extra


def _pack(lanes_for_c: int | None = None, batch_one: bool = False, floor_blocks: bool = False,
          clamp: bool = False, swap: bool = False):
    """A pack_activation with one mistake: a fixed block, batch 1, too few blocks, padding that repeats
    the last channel instead of zeros, or block and lane swapped."""
    from tvm import te

    def pack_activation(n, channels, h, w, c):
        c = lanes_for_c or c
        n = 1 if batch_one else n
        blocks = channels // c if floor_blocks else -(-channels // c)
        X = te.placeholder((n, channels, h, w), name="X")

        def element(b, cb, y, x, ci):
            ch = ci * blocks + cb if swap else cb * c + ci
            if clamp:
                return X[b, te.min(ch, channels - 1), y, x]
            return te.if_then_else(ch < channels, X[b, te.min(ch, channels - 1), y, x], tvm.tirx.const(0.0, "float32"))

        return te.create_prim_func([X, te.compute((n, blocks, h, w, c), element, name="Y")])

    return pack_activation


def test_day07_solution_passes_visible_and_hidden_tests():
    namespace = _day07_namespace()
    exec(_cell(DAY07, "pack_activation"), namespace)
    exec(_cell(DAY07, "test_pack_activation"), namespace)
    exec(_cell(DAY07, "test_unpack_activation"), namespace)


@pytest.mark.parametrize("mistake", [dict(floor_blocks=True), dict(clamp=True), dict(swap=True)])
def test_day07_pack_tests_catch_too_few_blocks_repeated_padding_and_swapped_indices(mistake):
    with pytest.raises(AssertionError, match="buffers should be|wrong place"):
        exec(_cell(DAY07, "test_pack_activation"), _day07_namespace(pack_activation=_pack(**mistake)))


@pytest.mark.parametrize("mistake", ["this CPU's block", "batch 1"])
def test_day07_hidden_pack_tests_alone_catch_a_pack_for_this_cpus_block_or_batch_one(mistake):
    namespace = _day07_namespace()
    wrong = _pack(lanes_for_c=namespace["LANES"]) if mistake == "this CPU's block" else _pack(batch_one=True)
    visible, hidden = _parts(DAY07, "test_pack_activation")
    namespace["pack_activation"] = wrong
    exec(visible, namespace)  # block LANES and batch 1: the visible test cannot tell
    with pytest.raises(AssertionError, match="buffers should be"):
        exec(hidden, namespace)


def test_day07_unpack_tests_catch_an_unpack_that_keeps_the_padding():
    from tvm import te

    def unpack_activation(n, channels, h, w, c):
        blocks = -(-channels // c)
        Y = te.placeholder((n, blocks, h, w, c), name="Y")
        return te.create_prim_func([Y, te.compute((n, blocks * c, h, w), lambda b, ch, y, x: Y[b, ch // c, y, x, ch % c])])

    with pytest.raises(AssertionError, match="buffers should be"):
        exec(_cell(DAY07, "test_unpack_activation"), _day07_namespace(unpack_activation=unpack_activation))


# ---------------------------------------------------------------- Day 12: int8

DAY12 = "day12_int8"


def _qparams(include_zero: bool = True, symmetric_abs: bool = True, round_zero_point: bool = True):
    """Exercise 1 with one mistake switched on."""

    def qparams(x, dtype):
        x = np.asarray(x, dtype=np.float64)
        if dtype == "uint8":
            low, high = (min(x.min(), 0.0), max(x.max(), 0.0)) if include_zero else (x.min(), x.max())
            scale = float(high - low) / 255 or 1.0
            zp = -low / scale
            return scale, int(np.clip(round(zp), 0, 255)) if round_zero_point else int(zp)
        if dtype == "int8":
            m = np.abs(x).max() if symmetric_abs else x.max()
            return float(m / 127 or 1.0), 0
        raise ValueError(dtype)

    return qparams


def _layer_error(zero_point: bool = True, honour_per_channel: bool = True):
    """Exercise 2 with one mistake switched on (Exercise 1 done right)."""
    right = _qparams()

    def layer_error(w, x, per_channel):
        sx, zx = right(x, "uint8")
        xq = np.clip(np.round(x / sx) + zx, 0, 255).astype(np.int64)
        if per_channel and honour_per_channel:
            sw = np.array([right(r, "int8")[0] for r in w])
        else:
            sw = np.full(w.shape[0], right(w, "int8")[0])
        wq = np.clip(np.round(w / sw[:, None]), -127, 127).astype(np.int64)
        y = ((xq - (zx if zero_point else 0)) @ wq.T) * sx * sw[None, :]
        return build.relative_error(y, x.astype(np.float64) @ w.T.astype(np.float64))

    return layer_error


def _choose_build_by_median(rows, min_top1):
    ok = sorted((r for r in rows if r["top1"] >= min_top1), key=lambda r: r["median_ms"])
    return ok[0]["backend"] if ok else None


def _choose_build_within_ten_percent(rows, min_top1):
    """A plausible wrong answer: 'clearly faster' read as 'more than 10 % faster' (medians only)."""
    ok = [r for r in rows if r["top1"] >= min_top1]
    if not ok:
        return None
    fastest = min(r["median_ms"] for r in ok)
    near = [r for r in ok if r["median_ms"] <= 1.1 * fastest]
    return max(near, key=lambda r: (r["top1"], -r["median_ms"]))["backend"]


def _choose_build_chained(rows, min_top1):
    """A plausible wrong answer: each build compared with the last one taken, not with the fastest."""
    ok = sorted((r for r in rows if r["top1"] >= min_top1), key=lambda r: r["median_ms"])
    if not ok:
        return None
    best = ok[0]
    for other in ok[1:]:
        if other["q1_ms"] <= best["q3_ms"] and best["q1_ms"] <= other["q3_ms"] and other["top1"] > best["top1"]:
            best = other
    return best["backend"]


def _day12_namespace(**extra) -> dict:
    return dict(np=np, build=build, ir=ir, quantize=quantize, tvm=tvm, relax=tvm.relax, target=machine.cpu_target()) | extra


def _int8_dense(zero_point: bool = True, per_column: bool = True, integer_product: bool = True,
                rows: int | None = None):
    """Exercise 5 with one mistake switched on."""
    relax = tvm.relax

    def int8_dense(m, w, x_scale, x_zero_point):
        k, n = w.shape
        w = w.astype(np.float32)
        scale_w = np.abs(w).max(axis=0) / 127 if per_column else np.full(n, np.abs(w).max() / 127, np.float32)
        scale_w[scale_w == 0] = 1.0
        wq = np.clip(np.round(w / scale_w), -127, 127).astype(np.int8)
        correction = (x_zero_point * wq.astype(np.int32).sum(axis=0) * zero_point).astype(np.int32)
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((rows or m, k), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                xq = bb.emit(relax.op.quantize(x, relax.const(x_scale, "float32"), relax.const(x_zero_point, "int32"),
                                               axis=1, out_dtype="uint8"))
                if integer_product:
                    acc = bb.emit(relax.op.astype(relax.op.matmul(xq, relax.const(wq), out_dtype="int32"), "float32"))
                else:  # fake quantization: the same integers, multiplied as float32
                    acc = bb.emit(relax.op.matmul(relax.op.astype(xq, "float32"), relax.const(wq.astype(np.float32))))
                acc = bb.emit(relax.op.subtract(acc, relax.const(correction.astype(np.float32))))
                out = bb.emit_output(bb.emit(relax.op.multiply(acc, relax.const((np.float32(x_scale) * scale_w).astype(np.float32)))))
            bb.emit_func_output(out)
        return bb.get()

    return int8_dense


def test_day12_solutions_pass_their_tests():
    namespace = _day12_namespace()
    for solution, tests in [("qparams", "test_qparams"), ("layer_error", "test_layer_error"),
                            ("choose_build", "test_choose_build"), ("int8_dense", "test_int8_dense")]:
        exec(_cell(DAY12, solution), namespace)
        exec(_cell(DAY12, tests), namespace)


def _dot_4x4(tmp_path, exact: bool):
    """Exercise 3's solution, loaded from a file (TVMScript reads its source); ``exact``: its implementation
    computes the exact int32 sums in loops, where the instruction pair saturates."""
    source = _cell(DAY12, "dot_4x4")
    if exact:
        start = source.index("            a_i32 = ")
        end = source.index("\n", source.index("C[T.ramp(T.int32(0), 1, 4)]"))
        source = source[:start] + (
            "            for i in T.serial(0, 4):\n"
            "                for k in T.serial(0, 4):\n"
            "                    C[i] = C[i] + T.cast(A[k], \"int32\") * T.cast(B[i, k], \"int32\")") + source[end:]
    path = tmp_path / f"dot_4x4_{exact}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.register_dot_4x4


def _dot_namespace(register):
    return _day12_namespace(register_dot_4x4=register, export=export, int8=int8, tempfile=tempfile, inspect=inspect)


def test_day12_the_intrinsic_s_solution_passes_and_one_computing_exact_sums_in_loops_fails(tmp_path):
    """The exact loops pass no saturation test: the machine code check catches them (no vpmaddubsw), and the
    saturating tests at 255 would if LLVM ever vectorized them with it."""
    exec(_cell(DAY12, "test_dot_4x4"), _dot_namespace(_dot_4x4(tmp_path, exact=False)))
    with pytest.raises(AssertionError, match="no vpmaddubsw on xmm|saturates each pair"):
        exec(_cell(DAY12, "test_dot_4x4"), _dot_namespace(_dot_4x4(tmp_path, exact=True)))


def test_day12_the_intrinsic_s_tests_refuse_the_course_s_own_description(tmp_path):
    source = _cell(DAY12, "dot_4x4")
    start, end = source.index("    @T.prim_func(s_tir=True)\n    def desc("), source.index("    @T.prim_func(s_tir=True)\n    def impl(")
    path = tmp_path / "borrowed.py"
    path.write_text("from helpers import int8\n" + source[:start] + "    desc = int8._dot_desc(4)\n\n" + source[end:])
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(AssertionError, match="write the description yourself"):
        exec(_cell(DAY12, "test_dot_4x4"), _dot_namespace(module.register_dot_4x4))


@pytest.mark.parametrize("mistake", [dict(include_zero=False), dict(symmetric_abs=False)])
def test_day12_hidden_qparams_tests_alone_catch_a_range_without_zero_or_sign(mistake):
    visible, hidden = _parts(DAY12, "test_qparams")
    namespace = _day12_namespace(qparams=_qparams(**mistake))
    exec(visible, namespace)  # [-1, 0, 3] has 0 inside and its largest magnitude on the positive side
    with pytest.raises(AssertionError):
        exec(hidden, namespace)


def test_day12_qparams_tests_catch_a_truncated_zero_point():
    namespace = _day12_namespace(qparams=_qparams(round_zero_point=False))
    with pytest.raises(AssertionError):
        exec(_cell(DAY12, "test_qparams"), namespace)


def test_day12_layer_tests_catch_a_forgotten_zero_point():
    namespace = _day12_namespace(qparams=_qparams(), layer_error=_layer_error(zero_point=False))
    with pytest.raises(AssertionError, match="relative error"):
        exec(_cell(DAY12, "test_layer_error"), namespace)


def test_day12_layer_tests_catch_per_tensor_weights_when_per_channel_is_asked():
    namespace = _day12_namespace(qparams=_qparams(), layer_error=_layer_error(honour_per_channel=False))
    with pytest.raises(AssertionError, match="per_channel=True"):
        exec(_cell(DAY12, "test_layer_error"), namespace)


@pytest.mark.parametrize("wrong", [_choose_build_within_ten_percent, _choose_build_chained])
def test_day12_hidden_choice_tests_alone_catch_a_ten_percent_rule_and_a_chain(wrong):
    visible, hidden = _parts(DAY12, "test_choose_build")
    namespace = _day12_namespace(choose_build=wrong)
    exec(visible, namespace)
    with pytest.raises(AssertionError, match="however|compare with the fastest"):
        exec(hidden, namespace)


def test_day12_hidden_choice_tests_alone_catch_a_choice_by_median_only():
    visible, hidden = _parts(DAY12, "test_choose_build")
    namespace = _day12_namespace(choose_build=_choose_build_by_median)
    exec(visible, namespace)
    with pytest.raises(AssertionError, match="clearly faster"):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 14: a bucketed prefill, a causal softmax, decoding

DAY14 = "day14_transformers"


@pytest.fixture(scope="module")
def day14_builds():
    """What Day 14's test cells use from the notebook: the model and its compiled prefill and decode."""
    from helpers import transformer

    model = transformer.TinyGPT()
    symbolic = transformer.import_prefill(model)
    return dict(model=model, symbolic=symbolic,
                any_length=transformer.compile_symbolic(symbolic),
                decoder=transformer.compile_decoder(transformer.import_decode(model)))


@pytest.fixture(scope="module")
def compiled_once():
    """``tvm.compile`` remembered by module and target while Day 14's bucket tests run: each wrong answer builds
    the same few buckets, and the test cell counts the calls (before the lookup), not the builds."""
    import tvm_ffi

    original, built = tvm.compile, {}

    def compile_once(mod, target=None, **kwargs):
        key = (tvm_ffi.structural_hash(mod), str(target), repr(sorted(kwargs.items())))
        if key not in built:
            built[key] = original(mod, target=target, **kwargs)
        return built[key]

    tvm.compile = compile_once
    try:
        yield
    finally:
        tvm.compile = original


def _day14_namespace(builds=None, **extra) -> dict:
    import torch.nn.functional as F
    from tvm import relax, te

    from helpers import paged_cache, transformer

    return dict(np=np, torch=torch, F=F, tvm=tvm, relax=relax, te=te, build=build, transformer=transformer,
                paged_cache=paged_cache, target=machine.cpu_target()) | (builds or {}) | extra


def _solution(grade_id: str, builds=None):
    namespace = _day14_namespace(builds)
    exec(_cell(DAY14, grade_id), namespace)
    return namespace[grade_id]


def test_day14_solutions_pass_their_tests(day14_builds, compiled_once):
    for solution, tests in [("bucketed_prefill", "test_bucketed_prefill"), ("causal_softmax", "test_causal_softmax"),
                            ("greedy_generate", "test_greedy_generate"), ("paged_block", "test_paged_block")]:
        namespace = _day14_namespace(day14_builds)
        exec(_cell(DAY14, solution), namespace)
        exec(_cell(DAY14, tests), namespace)


def _bucketed(order="smallest", pad="end", fits=lambda bucket, n: bucket >= n, check_length=True, build_when="first"):
    """A bucketed prefill with one mistake switched on (the defaults are right)."""
    from tvm import relax

    def bucketed_prefill(mod, params, buckets, target):
        (length,) = relax.analysis.defined_symbolic_vars(mod["main"])
        sizes = [int(b) for b in buckets]
        sizes = sorted(sizes) if order == "smallest" else sizes if order == "given" else sorted(sizes, reverse=True)
        vms = {}

        def vm_for(size):
            if size not in vms or build_when == "each request":
                vms[size] = relax.VirtualMachine(
                    tvm.compile(relax.transform.BindSymbolicVars({length: size})(mod), target=target), tvm.cpu())
            return vms[size]

        if build_when == "first":
            for size in sizes:
                vm_for(size)

        def prefill(ids):
            ids = np.asarray(ids)
            n = ids.shape[1]
            if check_length:
                size = next((b for b in sizes if fits(b, n)), None)
                if size is None:
                    raise ValueError(f"{n} tokens: the largest bucket is {max(sizes)}")
            else:
                size = next(b for b in sizes if fits(b, n))  # StopIteration for a request longer than every bucket
            padded = np.zeros((1, size), dtype=ids.dtype)
            if pad == "end":
                padded[:, :n] = ids
            else:
                padded[:, size - n:] = ids
            logits, keys, values = vm_for(size)["main"](tvm.runtime.tensor(padded), *params)
            cut = slice(0, n) if pad == "end" else slice(size - n, size)
            return size, logits.numpy()[:, cut], keys.numpy()[..., cut, :], values.numpy()[..., cut, :]

        return prefill

    return bucketed_prefill


@pytest.mark.parametrize("mistake, message", [
    (dict(pad="front"), "differ from PyTorch"),                   # padding first shifts every position
    (dict(order="largest"), "the smallest that holds it"),
    (dict(build_when="each request"), "tvm.compile"),              # builds while serving
])
def test_day14_bucket_tests_catch_front_padding_the_largest_bucket_and_builds_per_request(day14_builds, compiled_once,
                                                                                           mistake, message):
    with pytest.raises(AssertionError, match=message):
        exec(_cell(DAY14, "test_bucketed_prefill"), _day14_namespace(day14_builds, bucketed_prefill=_bucketed(**mistake)))


@pytest.mark.parametrize("mistake, message", [
    (dict(order="given"), "the smallest that holds it"),           # right only for buckets given in order
    (dict(fits=lambda bucket, n: bucket > n), "the smallest that holds it"),   # a length equal to a bucket skips it
    (dict(check_length=False), "should raise a ValueError"),       # a too-long request: StopIteration
])
def test_day14_hidden_bucket_tests_alone_catch_unsorted_buckets_a_skipped_equal_bucket_and_no_length_check(
        day14_builds, compiled_once, mistake, message):
    visible, hidden = _parts(DAY14, "test_bucketed_prefill")
    namespace = _day14_namespace(day14_builds, bucketed_prefill=_bucketed(**mistake))
    exec(visible, namespace)
    with pytest.raises(AssertionError, match=message):
        exec(hidden, namespace)


def _softmax(mask="bottom-right", fill="lowest", subtract_max=True, max_over="masked", past=None, static=False):
    """A causal softmax in TE with one mistake switched on (the defaults are right)."""
    from tvm import te

    def causal_softmax(scores):
        heads, n_queries, n_keys = scores.shape
        if static:
            n_queries, n_keys = int(n_queries), int(n_keys)
        shift = n_keys - n_queries if past is None else past
        visible = {"bottom-right": lambda i, j: j <= shift + i, "top-left": lambda i, j: j <= i,
                   "strict": lambda i, j: j < shift + i}[mask]
        lowest = tvm.tirx.min_value("float32") if fill == "lowest" else tvm.tirx.const(0.0, "float32")
        masked = te.compute(scores.shape, lambda h, i, j: te.if_then_else(visible(i, j), scores[h, i, j], lowest))
        source = masked if max_over == "masked" else scores
        r = te.reduce_axis((0, n_keys))
        row_max = te.compute((heads, n_queries), lambda h, i: te.max(source[h, i, r], axis=r))
        exps = te.compute(scores.shape, lambda h, i, j: te.exp(masked[h, i, j] - row_max[h, i]) if subtract_max
                          else te.if_then_else(visible(i, j), te.exp(masked[h, i, j]), tvm.tirx.const(0.0, "float32")))
        s = te.reduce_axis((0, n_keys))
        total = te.compute((heads, n_queries), lambda h, i: te.sum(exps[h, i, s], axis=s))
        return te.compute(scores.shape, lambda h, i, j: exps[h, i, j] / total[h, i])

    return causal_softmax


def test_day14_the_right_softmax_written_differently_passes():
    exec(_cell(DAY14, "test_causal_softmax"), _day14_namespace(causal_softmax=_softmax()))


@pytest.mark.parametrize("mistake, message", [
    (dict(mask="top-left"), "aligned top-left"),                    # is_causal's alignment, named as such
    (dict(mask="strict"), "relative error"),                         # a query that cannot see itself
    (dict(fill="zero"), "relative error"),                           # masked scores as 0: exp(0) is not 0
    (dict(static=True), "use the shape's expressions"),               # int() of a symbolic size
])
def test_day14_softmax_tests_catch_wrong_masks_and_python_ints(mistake, message):
    with pytest.raises(AssertionError, match=message):
        exec(_cell(DAY14, "test_causal_softmax"), _day14_namespace(causal_softmax=_softmax(**mistake)))


@pytest.mark.parametrize("mistake", [dict(subtract_max=False), dict(max_over="scores"), dict(past=2)])
def test_day14_hidden_softmax_tests_alone_catch_overflow_a_max_over_masked_keys_and_the_visible_past(mistake):
    visible, hidden = _parts(DAY14, "test_causal_softmax")
    namespace = _day14_namespace(causal_softmax=_softmax(**mistake))
    exec(visible, namespace)
    with pytest.raises(AssertionError, match="relative error"):
        exec(hidden, namespace)


def _generate(prefill_each_step=False, decode_last=False, first_position_offset=0, keep_first_cache=False):
    """A greedy loop with one mistake switched on."""

    def greedy_generate(prefill, decode, prompt, count):
        ids = np.asarray(prompt)
        logits, cache = prefill(ids)
        first_cache = cache
        found = [int(np.argmax(logits[0, -1]))]
        position = ids.shape[1] + first_position_offset
        steps = count if decode_last else count - 1
        for _ in range(steps):
            if prefill_each_step:
                ids = np.concatenate([ids, [[found[-1]]]], axis=1)
                logits, cache = prefill(ids)
            else:
                logits, cache = decode(found[-1], position, first_cache if keep_first_cache else cache)
            found.append(int(np.argmax(logits[0, -1])))
            position += 1
        return found[:count]

    return greedy_generate


@pytest.mark.parametrize("mistake", [dict(first_position_offset=-1), dict(keep_first_cache=True)])
def test_day14_decode_tests_catch_a_wrong_position_and_a_cache_not_handed_on(day14_builds, mistake):
    with pytest.raises(AssertionError, match="expected"):
        exec(_cell(DAY14, "test_greedy_generate"), _day14_namespace(day14_builds, greedy_generate=_generate(**mistake)))


@pytest.mark.parametrize("mistake", [dict(prefill_each_step=True), dict(decode_last=True)])
def test_day14_hidden_decode_tests_alone_catch_no_cache_and_a_wasted_last_step(day14_builds, mistake):
    visible, hidden = _parts(DAY14, "test_greedy_generate")
    namespace = _day14_namespace(day14_builds, greedy_generate=_generate(**mistake))
    exec(visible, namespace)
    with pytest.raises(AssertionError, match="prefill called|decode called"):
        exec(hidden, namespace)


def _paged_block(layer_fixed=False, scale_for_head_dim=None, norm_after=False, fused_heads=lambda heads, kv: heads + 2 * kv):
    """Day 14's block over the paged cache with one mistake switched on (the defaults are right)."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    class PagedBlock(nn.Module):
        def __init__(self, config) -> None:
            self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
            self.ln1, self.ln2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
            self.qkv = nn.Linear(config.width, (config.heads + 2 * config.kv_heads) * config.head_dim)
            self.proj = nn.Linear(config.width, config.width)
            self.fc, self.out = nn.Linear(config.width, 4 * config.width), nn.Linear(4 * config.width, config.width)

        def forward(self, x, cache, layer):
            batch, length, width = x.shape
            qkv = op.reshape(self.qkv(x if norm_after else self.ln1(x)),
                             (batch, length, fused_heads(self.heads, self.kv_heads), self.head_dim))
            scale = (scale_for_head_dim or self.head_dim) ** -0.5
            attended = cache.attention_with_fused_qkv(0 if layer_fixed else layer, qkv, self.heads, sm_scale=scale)
            x = x + self.proj(op.reshape(attended, (batch, length, width)))
            x = self.ln1(x) if norm_after else x
            return x + self.out(op.gelu(self.fc(self.ln2(x))))

    return PagedBlock


def test_day14_paged_block_tests_refuse_the_courses_block_and_its_subclasses():
    from helpers import paged_cache

    class Derived(paged_cache.PagedBlock):
        pass

    for theirs in (paged_cache.PagedBlock, Derived):  # each passes every check of the block's numbers
        with pytest.raises(AssertionError, match="write your own PagedBlock"):
            exec(_cell(DAY14, "test_paged_block"), _day14_namespace(PagedBlock=theirs))


def test_day14_paged_block_tests_catch_a_block_normalized_after_its_attention():
    with pytest.raises(AssertionError, match="prefill's logits differ"):
        exec(_cell(DAY14, "test_paged_block"), _day14_namespace(PagedBlock=_paged_block(norm_after=True)))


def test_day14_paged_block_tests_catch_the_courses_block_copied_for_one_key_value_head_per_query_head():
    with pytest.raises(AssertionError, match="did not build"):
        exec(_cell(DAY14, "test_paged_block"), _day14_namespace(PagedBlock=_paged_block(fused_heads=lambda heads, kv: 3 * heads)))


# the visible test's model has one block, of head size 8, with 4 query heads over 2 key/value heads: a block
# that always uses the first layer's pages, a softmax scale written for that head size, or a fused tensor of
# twice the query heads (which is 4 + 2 x 2 there) passes it
@pytest.mark.parametrize("mistake, message", [(dict(layer_fixed=True), "differs from PyTorch's|prefill's logits differ"),
                                              (dict(scale_for_head_dim=8), "prefill's logits differ"),
                                              (dict(fused_heads=lambda heads, kv: 2 * heads), "did not build")])
def test_day14_hidden_paged_block_tests_alone_catch_one_layers_pages_for_all_and_a_fixed_scale(mistake, message):
    visible, hidden = _parts(DAY14, "test_paged_block")
    namespace = _day14_namespace(PagedBlock=_paged_block(**mistake))
    exec(visible, namespace)
    with pytest.raises(AssertionError, match=message):
        exec(hidden, namespace)


def test_day12_int8_dense_tests_catch_a_forgotten_zero_point_one_weight_scale_and_a_float_product():
    for wrong, message in [(_int8_dense(zero_point=False), "relative error"), (_int8_dense(per_column=False), "relative error"),
                           (_int8_dense(integer_product=False), "uint8 x int8")]:
        with pytest.raises(AssertionError, match=message):
            exec(_cell(DAY12, "test_int8_dense"), _day12_namespace(int8_dense=wrong))


def test_day12_hidden_int8_dense_tests_alone_catch_the_visible_tests_shape_built_in():
    visible, hidden = _parts(DAY12, "test_int8_dense")
    namespace = _day12_namespace(int8_dense=_int8_dense(rows=4))  # the visible test's m, whatever m is asked
    exec(visible, namespace)
    with pytest.raises(AssertionError, match="takes x of shape"):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 8: the kernels a database leaves untuned

DAY08 = "day08_tuning"


def _day08_namespace() -> dict:
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    return dict(torch=torch, tvm=tvm, relax=relax, ms=ms, build=build, models=models, target=machine.cpu_target())


def _untuned_by_workload(fused, database, target):
    """Wrong: a kernel whose workload is in the database counts as tuned, even if every candidate failed."""
    from tvm.s_tir import meta_schedule as ms

    return {t.task_name for t in ms.relax_integration.extract_tasks(fused, target) if not database.has_workload(t.dispatched[0])}


def _untuned_by_target(fused, database, target):
    """Wrong: only a record timed for this very target counts (the pass replays another CPU's too)."""
    from tvm.s_tir import meta_schedule as ms

    left = set()
    for task in ms.relax_integration.extract_tasks(fused, target):
        found = database.query_tuning_record(task.dispatched[0], target, "main")
        if found is None or str(found.target) != str(target):
            left.add(task.task_name)
    return left


def test_day08_solution_passes_visible_and_hidden_tests():
    namespace = _day08_namespace()
    exec(_cell(DAY08, "kernels_left_untuned"), namespace)
    exec(_cell(DAY08, "test_kernels_left_untuned"), namespace)


@pytest.mark.parametrize("wrong, message", [(_untuned_by_workload, "failed"), (_untuned_by_target, "another CPU")])
def test_day08_hidden_tests_alone_catch_failed_records_and_other_cpus_records(wrong, message):
    visible, hidden = _parts(DAY08, "test_kernels_left_untuned")
    namespace = _day08_namespace() | {"kernels_left_untuned": wrong}
    exec(visible, namespace)   # the visible part passes on either mistake
    with pytest.raises(AssertionError, match=message):
        exec(hidden, namespace)


# ---------------------------------------------------------------- Day 15: bytes per token, Q4_0 as a tensor expression, the 8-bit product's schedule

DAY15 = "day15_llm"


def _day15_namespace(**extra) -> dict:
    import gguf
    from tvm import s_tir, te

    from helpers import kernels, llm

    namespace = dict(np=np, tvm=tvm, te=te, s_tir=s_tir, gguf=gguf, kernels=kernels, llm=llm, target=machine.cpu_target())
    nb = nbformat.read(grading.REPO / grading.SOURCE / DAY15 / f"{DAY15}.ipynb", as_version=4)
    exec(next(c.source for c in nb.cells if c.source.startswith("def q8_gemv(")), namespace)   # the notebook's own
    return namespace | extra


def test_day15_solutions_pass_their_tests():
    for exercise in ("bytes_per_token", "q4_0_weights", "schedule_q8"):
        namespace = _day15_namespace()
        exec(_cell(DAY15, exercise), namespace)
        exec(_cell(DAY15, f"test_{exercise}"), namespace)


def _bytes_per_token(kv_as_width=False, no_norms=False, tied_twice=False, untied_as_tied=False):
    def bytes_per_token(shape, weight_bits, embed_bits, tied=True):
        kv = shape.width if kv_as_width else shape.kv_heads * shape.head_dim
        weights = shape.layers * (2 * shape.width ** 2 + 2 * kv * shape.width + 3 * shape.mlp * shape.width)
        total = weights * weight_bits / 8 + (0 if no_norms else (2 * shape.layers + 1) * shape.width * 4)
        if tied or untied_as_tied:
            total += shape.vocab * shape.width * embed_bits / 8 * (2 if tied_twice else 1)
        else:
            total += shape.vocab * shape.width * weight_bits / 8 + shape.width * embed_bits / 8
        return int(round(total))
    return bytes_per_token


@pytest.mark.parametrize("mistake", [dict(kv_as_width=True), dict(no_norms=True), dict(tied_twice=True)])
def test_day15_bytes_tests_catch_full_size_keys_forgotten_norms_and_an_embedding_read_twice(mistake):
    with pytest.raises(AssertionError, match="bytes"):
        exec(_cell(DAY15, "test_bytes_per_token"), _day15_namespace(bytes_per_token=_bytes_per_token(**mistake)))


def test_day15_hidden_bytes_tests_alone_catch_an_untied_output_layer_read_at_the_embeddings_bits():
    visible, hidden = _parts(DAY15, "test_bytes_per_token")
    namespace = _day15_namespace(bytes_per_token=_bytes_per_token(untied_as_tied=True))
    exec(visible, namespace)    # SmolLM2 is tied: the visible test cannot tell
    with pytest.raises(AssertionError, match="tied=False"):
        exec(hidden, namespace)


def _q4_0_weights(offset=8, interleaved=False, group=None):
    from tvm import te

    def q4_0_weights(codes, scale):
        rows, half_cols = (int(d) for d in codes.shape)
        size = group or 2 * half_cols // int(scale.shape[1])
        half = size // 2

        def weight(n, k):
            g, i = k // size, k % size
            if interleaved:   # codes 2j and 2j + 1 in byte j, as some formats pack them
                byte = codes[n, g * half + i // 2]
                code = te.if_then_else(i % 2 == 0, byte & tvm.tirx.const(15, "uint8"), byte >> tvm.tirx.const(4, "uint8"))
            else:
                byte = codes[n, g * half + i % half]
                code = te.if_then_else(i < half, byte & tvm.tirx.const(15, "uint8"), byte >> tvm.tirx.const(4, "uint8"))
            return scale[n, g].astype("float32") * (code.astype("float32") - float(offset))

        return te.compute((rows, 2 * half_cols), weight, name="weights")
    return q4_0_weights


@pytest.mark.parametrize("mistake", [dict(offset=0), dict(interleaved=True)])
def test_day15_q4_0_tests_catch_codes_without_their_offset_and_interleaved_nibbles(mistake):
    with pytest.raises(AssertionError, match="weights differ"):
        exec(_cell(DAY15, "test_q4_0_weights"), _day15_namespace(q4_0_weights=_q4_0_weights(**mistake)))


def test_day15_hidden_q4_0_tests_alone_catch_groups_of_32_built_in():
    visible, hidden = _parts(DAY15, "test_q4_0_weights")
    namespace = _day15_namespace(q4_0_weights=_q4_0_weights(group=32))
    exec(visible, namespace)
    with pytest.raises(AssertionError, match="groups of"):
        exec(hidden, namespace)


def _schedule_q8(parallel=True, vectorize=True, scalar=False):
    from tvm import s_tir

    def schedule_q8(func):
        sch = s_tir.Schedule(func)
        if scalar:   # lanes across groups, 32 codes apart: each lane a gather, the sums scalar in effect
            n, g, j = sch.get_loops(sch.get_sblock("y"))
            partial = sch.rfactor(g, factor_axis=1)
            n, g, j = sch.get_loops(partial)
            sch.reorder(n, j, g)
            sch.reverse_compute_at(sch.get_sblock("y"), n)
            sch.parallel(n)
            sch.vectorize(g)
            sch.decompose_reduction(partial, j)
            return sch
        n, g, j = sch.get_loops(sch.get_sblock("y"))
        partial = sch.rfactor(j, factor_axis=1)
        n, g, j = sch.get_loops(partial)
        sch.reverse_compute_at(sch.get_sblock("y"), n)
        if parallel:
            sch.parallel(n)
        if vectorize:
            sch.vectorize(j)
        sch.decompose_reduction(partial, g)
        return sch
    return schedule_q8


@pytest.mark.parametrize("mistake, message", [(dict(parallel=False), "no parallel loop"),
                                              (dict(vectorize=False), "no vectorized loop"),
                                              (dict(scalar=True), "at least 3x")])
def test_day15_schedule_tests_catch_a_serial_loop_scalar_sums_and_a_slow_schedule(mistake, message):
    with pytest.raises(AssertionError, match=message):
        exec(_cell(DAY15, "test_schedule_q8"), _day15_namespace(schedule_q8=_schedule_q8(**mistake)))
