"""helpers.nchwc: a whole model's convolutions in channel blocks, built and tuned for real.

A small MobileNet-like network (a stem on 3 channels, depthwise and pointwise convolutions with
BatchNorm and ReLU6, a 24-channel layer, a residual add) checks which convolutions a block can take,
that the blocked build computes what PyTorch computes, and that a database records its layout.
"""

import contextlib
import io
import json
import re
import shutil

import numpy as np
import pytest
import torch
import tvm

from helpers import build, databases, dispatch, ir, models, nchwc, tuning
from helpers.errors import CourseError, TuningDatabaseError


def _conv_bn(c_in: int, c_out: int, groups: int = 1, relu6: bool = True) -> list[torch.nn.Module]:
    layers = [torch.nn.Conv2d(c_in, c_out, 3 if groups > 1 else 1, padding=1 if groups > 1 else 0, groups=groups,
                              bias=False), torch.nn.BatchNorm2d(c_out)]
    return layers + ([torch.nn.ReLU6()] if relu6 else [])


class SmallMobileNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
                                        torch.nn.BatchNorm2d(16), torch.nn.ReLU6())
        self.narrow = torch.nn.Sequential(*_conv_bn(16, 16, groups=16), *_conv_bn(16, 24, relu6=False))
        self.widen = torch.nn.Sequential(*_conv_bn(24, 32))
        self.residual = torch.nn.Sequential(*_conv_bn(32, 32, groups=32), *_conv_bn(32, 32, relu6=False))

    def forward(self, x):
        y = self.widen(self.narrow(self.stem(x)))
        return y + self.residual(y)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = SmallMobileNet().eval()
    with torch.no_grad():  # statistics away from 0 and 1, so that BatchNorm's arithmetic matters
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    return net


@pytest.fixture(scope="module")
def example():
    return torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def imported(model, example):
    return models.import_to_relax(model, example)


@pytest.fixture(scope="module")
def target():
    return tvm.target.Target({"kind": "llvm", "mcpu": str(tvm.target.codegen.llvm_get_system_cpu()), "num-cores": 2})


def _kernel_names(mod: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


@pytest.mark.parametrize("layout", ["NCHW8c", "NCHW16c"])
def test_a_blocked_build_computes_what_pytorch_computes(imported, model, example, target, layout):
    executable = tvm.compile(nchwc.fuse(imported.mod, target, layout), target=target)
    compiled = build.load_executable(executable, imported, target)
    with torch.no_grad():
        expected = model(example).numpy()
    np.testing.assert_allclose(compiled(example), expected, rtol=1e-4, atol=1e-4)


def _conv_layouts(mod: tvm.IRModule, layout: str) -> list[str]:
    converted = tvm.transform.Sequential(nchwc.layout_passes(layout))(mod)
    return [f"{c.attrs.data_layout}->{c.attrs.out_layout}" for c in ir.calls(converted, "relax.nn.conv2d")]


def test_each_side_of_a_convolution_takes_the_largest_block_that_divides_it(imported):
    # stem 3->16, depthwise 16, 16->24, 24->32, depthwise 32, 32->32
    assert _conv_layouts(imported.mod, "NCHW16c") == [
        "NCHW3c->NCHW16c", "NCHW16c->NCHW16c", "NCHW16c->NCHW8c", "NCHW8c->NCHW16c", "NCHW16c->NCHW16c", "NCHW16c->NCHW16c"]
    assert _conv_layouts(imported.mod, "NCHW8c") == ["NCHW3c->NCHW8c"] + ["NCHW8c->NCHW8c"] * 5
    assert _conv_layouts(imported.mod, "NCHW") == ["NCHW->NCHW"] * 6


def test_blocked_convolutions_become_tvms_blocked_kernels(imported, target):
    def blocked(layout):
        names = _kernel_names(nchwc.fuse(imported.mod, target, layout))
        return (sum("depthwise_conv2d_NCHWc" in n for n in names),
                sum("conv2d_NCHWc" in n and "depthwise" not in n for n in names))

    assert blocked("NCHW") == (0, 0)
    assert blocked("NCHW16c") == (2, 4)


def test_relu6_becomes_max_then_min_so_the_layout_passes_through_it(imported):
    converted = ir.op_histogram(tvm.transform.Sequential(nchwc.layout_passes("NCHW8c"))(imported.mod))
    assert ir.op_histogram(imported.mod)["clip"] == 4  # the import has ReLU6 as clip: the pass does the work
    assert converted["clip"] == 0 and converted["maximum"] == converted["minimum"] == 4
    assert nchwc.layout_passes("NCHW") == []


def test_the_block_fills_one_vector_register():
    assert nchwc.block_for(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})) == 8
    assert nchwc.block_for(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})) == 16
    assert nchwc.layout_name(16) == "NCHW16c" and nchwc.block_of("NCHW16c") == 16 and nchwc.block_of("NCHW") is None


@pytest.mark.parametrize("layout", ["NHWC", "NCHWc", "NCHW0c", "nchw16c"])
def test_an_unknown_layout_is_a_clear_error(imported, target, tmp_path, layout):
    with pytest.raises(ValueError, match="Unknown activation layout"):
        nchwc.block_of(layout)
    with pytest.raises(ValueError, match="Unknown activation layout"):
        tuning.tune(imported.mod, target, tmp_path, max_trials_per_task=1, layout=layout)
    assert not (tmp_path / tuning.SETTINGS_FILE).exists()  # refused before anything was written


@pytest.fixture(scope="module")
def tuned(imported, target, tmp_path_factory):
    """The small net tuned for one trial per kernel, prepacked, in NCHW and in NCHW8c: {layout: directory}."""
    root = tmp_path_factory.mktemp("tuned")
    with contextlib.redirect_stdout(io.StringIO()):
        for layout in (nchwc.PLAIN, "NCHW8c"):
            tuning.tune(imported.mod, target, root / layout, max_trials_per_task=1, prepack=True, layout=layout)
    return {layout: root / layout for layout in (nchwc.PLAIN, "NCHW8c")}


def test_a_database_records_its_layout_and_its_builds_follow_it(imported, model, example, target, tuned):
    work_dir = tuned["NCHW8c"]
    assert json.loads((work_dir / tuning.SETTINGS_FILE).read_text())["layout"] == "NCHW8c"
    assert tuning.tuned_layout(work_dir) == "NCHW8c"
    assert "layout" not in json.loads((tuned[nchwc.PLAIN] / tuning.SETTINGS_FILE).read_text())
    assert tuning.tuned_layout(tuned[nchwc.PLAIN]) == nchwc.PLAIN
    applied = tuning.apply_database(imported.mod, target, work_dir)
    assert any("conv2d_NCHWc" in n for n in _kernel_names(applied))
    compiled = tuning.compile_tuned(imported, target, work_dir)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(example), model(example).numpy(), rtol=1e-4, atol=1e-4)
    with pytest.raises(TuningDatabaseError, match="layout='NCHW8c'"):
        tuning.tune(imported.mod, target, work_dir, max_trials_per_task=1, prepack=True)


def test_the_weights_layout_rewrites_run_once_at_load_so_they_are_not_tuned(imported, target, tuned):
    prepared = tuning.prepare(imported.mod, target, True, "NCHW8c")
    every_kernel = tuning.extract_tasks(prepared, target)
    per_call = {t.task_name for t in tuning.extract_tasks(tuning.per_call_kernels(prepared), target)}
    weight_only = [t for t in every_kernel if t.task_name not in per_call]
    assert any("layout_transform" in t.task_name for t in weight_only)  # the weights' blocks (and BatchNorm's reshaped statistics)
    assert not any("conv2d" in t.task_name for t in weight_only)
    db = tuning.load_database(tuned["NCHW8c"])
    assert not any(db.has_workload(t.dispatched[0]) for t in weight_only)
    assert all(db.has_workload(t.dispatched[0]) for t in every_kernel if t.task_name in per_call)


def test_seeding_from_a_database_of_another_layout_says_which_layout_to_tune(imported, target, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / tuning.SETTINGS_FILE).write_text(json.dumps({"prepack": True, "layout": "NCHW16c"}))
    with pytest.raises(TuningDatabaseError, match="Pass layout='NCHW16c' to seed from it"):
        tuning.tune(imported.mod, target, tmp_path / "mine", max_trials_per_task=1, prepack=True, seed_from=source)


def _scheduled_kernels(mod: tvm.IRModule, target, work_dir, layout: str) -> list[str]:
    applied = tuning.apply_database(mod, target, work_dir, layout=layout)
    return sorted(gv.name_hint for gv, f in applied.functions.items()
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("tirx.is_scheduled", False))


def test_a_blocked_database_takes_the_plain_kernels_that_a_dispatched_build_leaves_in_tvm(
        imported, model, example, target, tuned, tmp_path):
    plain, blocked = tuned[nchwc.PLAIN], shutil.copytree(tuned["NCHW8c"], tmp_path / "blocked")
    offloaded = dispatch.offload_convs(imported.mod, prepack=True)  # the depthwise convolutions stay in TVM
    wanted = _scheduled_kernels(offloaded, target, plain, nchwc.PLAIN)
    assert any("conv2d" in name for name in wanted), wanted
    with pytest.raises(TuningDatabaseError, match="0 of this module's"):
        _scheduled_kernels(offloaded, target, blocked, nchwc.PLAIN)

    added = tuning.add_kernels_from(blocked, plain)
    assert added > 0
    assert _scheduled_kernels(offloaded, target, blocked, nchwc.PLAIN) == wanted
    settings = json.loads((blocked / tuning.SETTINGS_FILE).read_text())
    assert settings["layout"] == "NCHW8c"
    assert settings["kernels_from"] == [{"database": plain.name, "layout": "NCHW", "trials_per_task": 1, "kernels": added}]
    assert tuning.add_kernels_from(blocked, plain) == 0, "a kernel it has already is not copied again"
    settings = json.loads((blocked / tuning.SETTINGS_FILE).read_text())
    assert settings["kernels_from"] == [{"database": plain.name, "layout": "NCHW", "trials_per_task": 1, "kernels": added}], (
        "one entry per source database, whatever the number of copies")
    database = databases.Database(blocked, databases.YOURS, "here", 2, 1, transferred=False)
    compiled = dispatch.compile_dispatched(imported, target, database=database, prepack=True)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(example), model(example).numpy(), rtol=1e-4, atol=1e-4)


def test_kernels_are_copied_only_between_databases_prepared_alike(tmp_path):
    for name, prepack in (("packed", True), ("plain", False)):
        (tmp_path / name).mkdir()
        (tmp_path / name / tuning.SETTINGS_FILE).write_text(json.dumps({"prepack": prepack}))
    with pytest.raises(TuningDatabaseError, match="prepack=False .* would never match"):
        tuning.add_kernels_from(tmp_path / "packed", tmp_path / "plain")
    with pytest.raises(CourseError, match="another database"):
        tuning.add_kernels_from(tmp_path / "packed", tmp_path / "packed")


def _run_kernel(kernel: tvm.IRModule, target, arrays: list[np.ndarray]) -> np.ndarray:
    """Build one TIR kernel and run it on ``arrays`` (its last buffer is the output)."""
    lib = tvm.compile(kernel, target=target)
    args = [tvm.runtime.tensor(a) for a in arrays]
    lib["main"](*args)
    return args[-1].numpy()


def _random_arguments(func: tvm.tirx.PrimFunc, rng: np.random.Generator) -> list[np.ndarray]:
    """Arguments for a kernel: random inputs, a zeroed output (its last argument)."""
    shapes = [[int(d) for d in a.shape] for a in tvm.s_tir.meta_schedule.arg_info.ArgInfo.from_prim_func(func)]
    return [rng.standard_normal(s).astype("float32") for s in shapes[:-1]] + [np.zeros(shapes[-1], "float32")]


def _templates_match_the_unscheduled_kernels(mod: tvm.IRModule, target, convs: int, depthwise: int) -> None:
    """Each blocked kernel under its template, three sampled tilings, against the kernel unscheduled."""
    tasks = tvm.s_tir.meta_schedule.relax_integration.extract_tasks(mod, target)
    templated = [(t.dispatched[0], nchwc.template_for(t.dispatched[0])) for t in tasks]
    templated = [(kernel, schedule) for kernel, schedule in templated if schedule is not None]
    schedules = [schedule for _, schedule in templated]
    assert len(templated) == convs + depthwise
    assert (schedules.count(nchwc.schedule_conv2d_nchwc), schedules.count(nchwc.schedule_depthwise_nchwc)) == (convs, depthwise)
    assert all(nchwc.search_space(t) == "post-order-apply" for t in tasks if nchwc.template_for(t.dispatched[0]) is None)
    rng = np.random.default_rng(0)
    for kernel, schedule in templated:
        arrays = _random_arguments(kernel["main"], rng)
        expected = _run_kernel(kernel, target, [a.copy() for a in arrays])
        for seed in (1, 2, 3):
            sch = tvm.s_tir.Schedule(kernel, seed=seed)
            schedule(sch)
            script = sch.mod.script()
            assert "vectorized" in script and "parallel" in script
            # Everything after the convolution is one block written with the tile: no loop left serial.
            assert len(sch.get_child_blocks(sch.get_sblock("root"))) <= 4  # padding, init, update, the written tile
            for block in sch.get_child_blocks(sch.get_sblock("root")):  # the padding too: a pass split between
                outer = sch.get(sch.get_loops(block)[0])                 # the cores, or inside the convolution's tiles
                assert outer.kind == tvm.tirx.ForKind.PARALLEL, (schedule.__name__, sch.get(block).name_hint)
            np.testing.assert_allclose(_run_kernel(sch.mod, target, [a.copy() for a in arrays]), expected, rtol=1e-4, atol=1e-4)


def test_days_7_schedule_computes_every_blocked_convolution_right_whatever_tiles_it_samples(imported, target):
    # the stem (3 channels in), 16 -> 24 and 24 -> 32 with BatchNorm, 32 -> 32 with the add; two depthwise
    _templates_match_the_unscheduled_kernels(nchwc.fuse(imported.mod, target, "NCHW8c"), target, convs=4, depthwise=2)


class SiluBlock(torch.nn.Module):
    """EfficientNet's pattern: SiLU reads its input twice (``x * sigmoid(x)``), so the epilogue is not a chain."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.SiLU())
        self.depthwise = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False),
                                             torch.nn.BatchNorm2d(32), torch.nn.SiLU())

    def forward(self, x):
        return self.depthwise(self.expand(x))


def test_the_schedules_fold_silu_into_the_tile_they_write(target):
    torch.manual_seed(0)
    block = SiluBlock().eval()
    imported = models.import_to_relax(block, torch.randn(1, 16, 10, 10))
    _templates_match_the_unscheduled_kernels(nchwc.fuse(imported.mod, target, "NCHW16c"), target, convs=1, depthwise=1)


def _parallel_loops(script: str) -> list[str]:
    return re.findall(r"for (\w+) in T\.parallel", script)


@pytest.mark.parametrize("size, by_rows", [(16, True), (2, False)])
def test_the_cores_split_the_output_by_rows_unless_the_weights_outweigh_the_input_many_times(target, size, by_rows):
    # 64 -> 64 channels, 3x3: its weights are 2x its (padded) input at 16x16, 36x at 2x2
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1, bias=False), torch.nn.BatchNorm2d(64),
                               torch.nn.ReLU()).eval()
    imported = models.import_to_relax(conv, torch.randn(1, 64, size, size))
    mod = nchwc.fuse(imported.mod, target, "NCHW8c")
    _templates_match_the_unscheduled_kernels(mod, target, convs=1, depthwise=0)
    (kernel,) = [t.dispatched[0] for t in tvm.s_tir.meta_schedule.relax_integration.extract_tasks(mod, target)
                 if nchwc.template_for(t.dispatched[0]) is not None]
    sch = tvm.s_tir.Schedule(kernel, seed=1)
    nchwc.schedule_conv2d_nchwc(sch)
    loops = _parallel_loops(sch.mod.script())
    (conv_loop,) = [name for name in loops if "oc_chunk" in name]
    assert (conv_loop.index("oh") < conv_loop.index("oc_chunk")) == by_rows, conv_loop
    (pad_loop,) = [name for name in loops if name != conv_loop]
    assert (pad_loop.index("i2") < pad_loop.index("i1")) == by_rows, pad_loop  # the padding splits alike


def test_a_row_that_does_not_divide_the_width_leaves_a_shorter_last_tile_computed_right(target):
    # 10 pixels wide: rows of 3, 4, 6, 7, 8 or 9 pixels leave a tail (the schedule checks each pixel's bound)
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                               torch.nn.ReLU()).eval()
    imported = models.import_to_relax(conv, torch.randn(1, 16, 10, 10))
    (kernel,) = [t.dispatched[0] for t in tvm.s_tir.meta_schedule.relax_integration.extract_tasks(
        nchwc.fuse(imported.mod, target, "NCHW8c"), target) if nchwc.template_for(t.dispatched[0]) is not None]
    arrays = _random_arguments(kernel["main"], np.random.default_rng(0))
    expected = _run_kernel(kernel, target, [a.copy() for a in arrays])
    rows = set()
    for seed in range(1, 40):
        sch = tvm.s_tir.Schedule(kernel, seed=seed)
        nchwc.schedule_conv2d_nchwc(sch)
        (row,) = [int(inst.attrs[0][decision]) for inst, decision in sch.trace.decisions.items()
                  if inst.kind.name == "SampleCategorical"]
        if row in rows or 10 % row == 0:
            continue
        rows.add(row)
        np.testing.assert_allclose(_run_kernel(sch.mod, target, [a.copy() for a in arrays]), expected, rtol=1e-4, atol=1e-4)
        if len(rows) == 2:
            break
    assert len(rows) == 2, f"the search never sampled a row that leaves a tail: {rows}"


def _gate_times_map(blocks: int, lanes: int, rows: int = 6):
    """A squeeze-excite gate (one value per channel) times a map in channel blocks, as an element-wise kernel
    of its own (EfficientNet-B0's 480- and 672-channel gates are, after fusion), unscheduled."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def gate(g: T.Buffer((1, blocks, 1, 1, lanes), "float32"), x: T.Buffer((1, blocks, rows, 5, lanes), "float32"),
             y: T.Buffer((1, blocks, rows, 5, lanes), "float32")):
        T.func_attr({"tirx.noalias": True, "op_pattern": 1})
        for a0, a1, a2, a3, a4 in T.grid(1, blocks, rows, 5, lanes):
            with T.sblock("T_multiply"):
                v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [a0, a1, a2, a3, a4])
                y[v0, v1, v2, v3, v4] = g[v0, v1, 0, 0, v4] * x[v0, v1, v2, v3, v4]

    return gate


def test_element_wise_kernels_over_blocked_maps_are_scheduled_once_not_tuned(target):
    mod = tvm.IRModule({"gate16": _gate_times_map(3, 16), "gate8": _gate_times_map(2, 8),
                        "odd_lanes": _gate_times_map(2, 3), "reduction": _gate_times_map(2, 16).with_attr("op_pattern", 3)})
    scheduled = nchwc.schedule_blocked_elementwise(mod)
    rng = np.random.default_rng(0)
    for name in ("gate16", "gate8"):
        func = scheduled[name]
        assert func.attrs["tirx.is_scheduled"] and "T.parallel" in func.script() and "T.vectorized" in func.script()
        arrays = _random_arguments(mod[name], rng)
        expected = arrays[0] * arrays[1]
        np.testing.assert_allclose(_run_kernel(tvm.IRModule({"main": func}), target, arrays), expected)
    for name in ("odd_lanes", "reduction"):  # not over vector-wide channel blocks, or not element-wise: left alone
        assert "tirx.is_scheduled" not in scheduled[name].attrs and "T.parallel" not in scheduled[name].script()
