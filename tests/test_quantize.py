"""Post-training int8 quantization in Relax (helpers.quantize, Day 12): real models, real builds."""

import re

import numpy as np
import pytest
import torch
import torchvision
import tvm
import tvm_ffi

from helpers import amx, build, export, int8, ir, machine, models, nchwc, quantize, timing, tuning
from helpers.errors import CourseError
from shipped_databases import assert_every_kernel_covered

TARGET = machine.cpu_target()


class Pointwise(torch.nn.Module):
    """Stem, a depthwise block with two pointwise convolutions (one with 24 outputs: padded to 32 for
    VNNI), a residual add and BatchNorms: every case the rewrite handles, in milliseconds."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                                        torch.nn.ReLU6())
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU6())
        self.depthwise = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False),
                                             torch.nn.BatchNorm2d(32), torch.nn.ReLU6())
        self.project = torch.nn.Sequential(torch.nn.Conv2d(32, 24, 1, bias=False), torch.nn.BatchNorm2d(24))
        self.skip = torch.nn.Conv2d(16, 24, 1)

    def forward(self, x):
        s = self.stem(x)
        return self.project(self.depthwise(self.expand(s))) + self.skip(s)


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    model = quantize.with_batchnorm_statistics(Pointwise().eval(), inputs)
    folded = quantize.fold_batch_norms(model)
    x = torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(9))
    return model, folded, quantize.calibrate(folded, inputs), x


def test_activation_params_cover_the_range_and_represent_zero_exactly():
    for low, high in [(-1.0, 3.0), (0.5, 6.0), (-4.0, -1.0), (0.0, 0.0)]:
        scale, zp = quantize.activation_params(quantize.Range(low, high))
        assert scale > 0 and 0 <= zp <= 255 and isinstance(zp, int)
        assert scale * (0 - zp) <= min(low, 0.0) + scale / 2 and scale * (255 - zp) >= max(high, 0.0) - scale / 2
        assert scale * (zp - zp) == 0.0


def test_per_channel_weights_round_trip_within_half_a_step_of_their_own_channel():
    w = np.random.default_rng(0).normal(0, 1, (6, 10)) * np.logspace(-3, 0, 6)[:, None]
    q, scale = quantize.quantize_weight(w.astype(np.float32))
    assert q.dtype == np.int8 and scale.shape == (6,) and np.abs(q).max() <= 127
    assert np.all(np.abs(q * scale[:, None] - w) <= scale[:, None] / 2 + 1e-7)


def test_folding_batch_norm_keeps_the_output_and_removes_every_batch_norm(small):
    model, folded, _, x = small
    with torch.no_grad():
        assert build.relative_error(folded(x).numpy(), model(x).numpy()) < 1e-5
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())


def test_resnet_blocks_batch_norms_are_folded_only_when_asked():
    """torchvision's ResNet keeps conv1/bn1 and the rest as attributes: only ``downsample`` is a Sequential."""
    inputs = [torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    blocks = torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=10)
    model = quantize.with_batchnorm_statistics(blocks.eval(), inputs)
    count = lambda m: sum(isinstance(b, torch.nn.BatchNorm2d) for b in m.modules())
    assert count(quantize.fold_batch_norms(model)) == count(model) - 3  # the three downsamples' only
    folded = quantize.fold_batch_norms(model, resnet_blocks=True)
    assert count(folded) == 0
    x = torch.randn(1, 3, 40, 40, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert build.relative_error(folded(x).numpy(), model(x).numpy()) < 1e-5


def test_random_weights_get_batch_norm_statistics_that_separate_inputs():
    """A random MobileNetV2 says the same class for everything; with re-estimated statistics it does not."""
    model, trained = quantize.float_model()
    if trained:
        pytest.skip("trained weights are available here")
    images = [models.example_input(seed=s) for s in range(4)]
    with torch.no_grad():
        classes = {int(model(x).argmax()) for x in images}
        logits = model(images[0])
    assert len(classes) > 1 and float(logits.std()) > 1e-3


def test_calibration_records_each_pointwise_input_in_call_order(small):
    _, folded, ranges, _ = small
    assert list(ranges) == ["expand.0", "project.0", "skip"]  # the 3x3 stem and the depthwise conv are not
    assert ranges["project.0"].low >= 0.0 and ranges["project.0"].high <= 6.0  # after a ReLU6


@pytest.mark.parametrize("nhwc", [True, False])
def test_the_int8_module_runs_close_to_float_with_every_pointwise_conv_in_int8(small, nhwc):
    model, folded, ranges, x = small
    imported = models.import_to_relax(folded, x)
    quantized = quantize.quantize_pointwise_convs(imported, ranges, nhwc=nhwc)
    ops = ir.op_histogram(quantized.mod)
    assert ops["nn.conv2d"] == 2 and ops["quantize"] == 3 and ops["dequantize"] == 3 and ops["call_tir"] == 3
    assert quantized.params == []  # weights are bound: the int8 ones packed
    compiled = build.compile_model(quantized)
    with torch.no_grad():
        want = model(x).numpy()
    error = build.relative_error(compiled(x), want)
    assert 0 < error < 0.05, f"int8 is {error:.3g} away from float32"


def test_calibrating_another_model_is_refused(small):
    _, folded, ranges, x = small
    imported = models.import_to_relax(folded, x)
    with pytest.raises(CourseError, match="calibrate the same model"):
        quantize.quantize_pointwise_convs(imported, dict(list(ranges.items())[:2]))


def test_scales_do_not_change_the_kernels_a_database_is_keyed_by(small):
    """Calibration values are data, not code: another calibration gives the same kernels."""
    _, folded, ranges, x = small
    imported = models.import_to_relax(folded, x)
    widened = {k: quantize.Range(r.low - 1.0, r.high * 2) for k, r in ranges.items()}
    hashes = []
    for r in (ranges, widened):
        tasks = tuning.extract_tasks(build.fuse(quantize.quantize_pointwise_convs(imported, r).mod, TARGET), TARGET)
        hashes.append(sorted(tvm_ffi.structural_hash(t.dispatched[0]) for t in tasks))
    assert hashes[0] == hashes[1]


@pytest.mark.skipif(not int8.has_vnni(TARGET), reason="this CPU has no AVX-512 VNNI")
def test_tuning_puts_vpdpbusd_into_the_int8_kernels_and_keeps_the_numbers(small, tmp_path):
    model, folded, ranges, x = small
    quantized = quantize.quantize_pointwise_convs(models.import_to_relax(folded, x), ranges)
    untuned = build.compile_model(quantized)(x)
    target = amx.without_tiles(TARGET)  # (with AMX the int8 products go on tiles and are not tuned)
    tuning.tune(quantized.mod, target, tmp_path / "db", max_trials_per_task=2, progress=False,
                space_for=quantize.space_for(target))
    executable = tuning.build_tuned(quantized.mod, target, tmp_path / "db")
    executable.export_library(str(tmp_path / "int8.so"))
    counts = export.instruction_counts(tmp_path / "int8.so", ["vpdpbusd"])
    assert counts["vpdpbusd"] > 0
    tuned = build.load_executable(executable, quantized, target)(x)
    assert build.relative_error(tuned, untuned) < 1e-5  # the same integer arithmetic, scheduled


@pytest.mark.skipif(not amx.has_amx(TARGET, amx.INT8), reason=f"{machine.cpu_name()} has no AMX-INT8")
def test_with_amx_the_int8_products_are_on_tiles_untuned_and_keep_the_numbers(small, tmp_path):
    model, folded, ranges, x = small
    quantized = quantize.quantize_pointwise_convs(models.import_to_relax(folded, x), ranges)
    untuned = build.compile_model(quantized)(x)
    from helpers.tuning.tasks import prepare

    prepared = prepare(quantized.mod, TARGET, prepack=False)
    products = {gv.name_hint for gv, f in prepared.functions.items() if "int8_conv1x1" in gv.name_hint}
    on_tiles = {gv.name_hint for gv, f in prepared.functions.items() if "tdpbusd" in str(f)}
    assert len(products) >= 2 and on_tiles == products  # the expand, project and skip convolutions
    assert not any(quantize.is_int8_kernel(task) for task in tuning.extract_tasks(prepared, TARGET))  # none tuned
    tuning.tune(quantized.mod, TARGET, tmp_path / "db", max_trials_per_task=1, progress=False,
                space_for=quantize.space_for(TARGET))
    executable = tuning.build_tuned(quantized.mod, TARGET, tmp_path / "db")
    executable.export_library(str(tmp_path / "int8.so"))
    assert export.instruction_counts(tmp_path / "int8.so", ["tdpbusd"])["tdpbusd"] > 0
    tuned = build.load_executable(executable, quantized, TARGET)(x)
    assert build.relative_error(tuned, untuned) < 1e-5  # the same integer sums


def test_the_depthwise_kernels_between_the_int8_ones_get_the_register_tiled_space_and_keep_their_numbers(small):
    """The float32 depthwise convolution of the small model, with its epilogue (bias, clip, quantization to uint8) as
    fusion leaves it: only it gets ``nchwc.depthwise_nhwc_space``; each tile size the schedule samples computes the
    unscheduled kernel's codes (within one: sums in another order)."""
    model, folded, ranges, x = small
    quantized = quantize.quantize_pointwise_convs(models.import_to_relax(folded, x), ranges)
    tasks = tuning.extract_tasks(build.fuse(quantized.mod, TARGET), TARGET)
    spaces = {t.task_name: quantize.space_for(TARGET)(t) for t in tasks}
    depthwise = [t for t in tasks if isinstance(spaces[t.task_name], type(nchwc.depthwise_nhwc_space()))
                 and not quantize.is_quantize_nhwc(t)]
    assert len(depthwise) == 1 and nchwc.is_depthwise_nhwc(depthwise[0]), spaces
    kernel = depthwise[0].dispatched[0]
    rng = np.random.default_rng(0)
    params = [p.ty for p in kernel["main"].params]
    arrays = [rng.normal(size=[int(d) for d in t.shape]).astype(str(t.dtype)) for t in params]
    outputs = []
    for seed in (None, 1, 2, 3):
        scheduled = kernel
        if seed is not None:
            sch = tvm.s_tir.Schedule(kernel, seed=seed)
            nchwc.schedule_depthwise_nhwc(sch, lanes=nchwc.block_for(TARGET))
            scheduled = sch.mod
        tensors = [tvm.runtime.tensor(a.copy()) for a in arrays]
        tvm.compile(scheduled, target=TARGET)(*tensors)
        outputs.append(tensors[-1].numpy().astype(np.int32))
    assert str(params[-1].dtype) == "uint8" and len(np.unique(outputs[0])) > 10  # quantized codes, not all one value
    for scheduled in outputs[1:]:
        assert np.abs(scheduled - outputs[0]).max() <= 1


def test_the_depthwise_convolutions_read_uint8_and_compute_the_dequantized_inputs_convolution(small):
    """``quantize_depthwise_inputs``: the one depthwise convolution of the small model becomes a quantize (which fusion
    joins to the expansion before it) and a kernel of bytes, its padding the zero point. Its output is the float
    depthwise convolution of the quantized-then-dequantized input, to float32 rounding, and within the int8 model's
    own error of the float model."""
    model, folded, ranges, x = small
    inputs = [torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    depthwise_ranges = quantize.calibrate(folded, inputs, which=quantize.is_depthwise)
    assert list(depthwise_ranges) == ["depthwise.0"]
    pointwise = quantize.quantize_pointwise_convs(models.import_to_relax(folded, x), ranges)
    both = quantize.quantize_depthwise_inputs(pointwise, depthwise_ranges)
    before, after = ir.op_histogram(pointwise.mod), ir.op_histogram(both.mod)
    assert before.get("nn.conv2d") == 2 and after.get("nn.conv2d") == 1  # the stem stays; the depthwise one is a kernel
    assert after["quantize"] == before["quantize"] + 1
    fused = tuning.extract_tasks(build.fuse(both.mod, TARGET), TARGET)
    bytes_in = [t for t in fused if "depthwise_from_u8" in t.task_name]
    assert len(bytes_in) == 1 and str(bytes_in[0].dispatched[0]["main"].params[0].ty.dtype) == "uint8"
    # the expansion's kernel ends with its ReLU6 (max, min) and the depthwise input's quantize: it writes bytes
    assert any("int8_conv1x1" in t.task_name and re.search(r"_minimum\d*_quantize\d*$", t.task_name) for t in fused)
    with torch.no_grad():
        expected = model(x).numpy()
    int8_error = build.relative_error(build.compile_model(pointwise)(x), expected)
    assert build.relative_error(build.compile_model(both)(x), expected) < 2 * int8_error + 0.02

    # the kernel alone: padding with the zero point is padding the dequantized input with 0.0
    scale, zp = quantize.activation_params(quantize.Range(0.0, 6.0))
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, (1, 7, 9, 16)).astype("uint8")
    weight = rng.normal(size=(3, 3, 16)).astype("float32")  # [kh, kw, C]
    X = tvm.te.placeholder(codes.shape, "uint8")
    W = tvm.te.placeholder(weight.shape, "float32")
    kernel = tvm.compile(tvm.te.create_prim_func([X, W, quantize.depthwise_from_uint8_compute(X, W, zp, (2, 2), (1, 1, 1, 1))]),
                         target="llvm")
    got = tvm.runtime.tensor(np.zeros((1, 4, 5, 16), "float32"))
    kernel(tvm.runtime.tensor(codes), tvm.runtime.tensor(weight * scale), got)
    got = got.numpy() - zp * (weight * scale).sum(axis=(0, 1))
    dequantized = torch.from_numpy((codes.astype("float32") - zp) * scale).permute(0, 3, 1, 2)
    want = torch.nn.functional.conv2d(dequantized, torch.from_numpy(weight).permute(2, 0, 1)[:, None], stride=2, padding=1,
                                      groups=16).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_depthwise_ranges_from_another_model_are_refused_with_what_to_do(small):
    model, folded, ranges, x = small
    pointwise = quantize.quantize_pointwise_convs(models.import_to_relax(folded, x), ranges)
    with pytest.raises(CourseError, match="depthwise convolutions were calibrated"):
        quantize.quantize_depthwise_inputs(pointwise, {"a": quantize.Range(0, 6), "b": quantize.Range(0, 6)})


def test_the_course_reads_depthwise_inputs_as_uint8_where_its_products_run_on_vnni():
    assert quantize.uint8_depthwise(tvm.target.Target({"kind": "llvm", "mcpu": "znver5"}))
    assert quantize.uint8_depthwise(tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server"}))
    assert not quantize.uint8_depthwise(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}))


def test_a_quantize_left_apart_gets_its_own_schedule_and_keeps_every_code():
    """A residual stream's quantize (its float32 also read by an addition, so fusion leaves it alone): only it gets
    ``quantize_nhwc_space``, and ``schedule_quantize_nhwc`` writes the unscheduled kernel's codes, for channel counts
    that do and do not fill a vector."""
    from tvm import relax

    for channels in (24, 32):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType([1, 8, 8, channels], "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                q = bb.emit(relax.op.quantize(x, relax.const(np.full(channels, 0.05, "float32")),
                                              relax.const(np.full(channels, 7, "int32")), axis=3, out_dtype="uint8"))
                out = bb.emit_output(q)
            bb.emit_func_output(out)
        tasks = tuning.extract_tasks(build.fuse(bb.get(), TARGET), TARGET)
        assert len(tasks) == 1 and quantize.is_quantize_nhwc(tasks[0])
        assert type(quantize.space_for(TARGET)(tasks[0])) is type(quantize.quantize_nhwc_space())
        kernel = tasks[0].dispatched[0]
        sch = tvm.s_tir.Schedule(kernel)
        quantize.schedule_quantize_nhwc(sch)
        data = np.random.default_rng(channels).normal(0, 3, (1, 8, 8, channels)).astype("float32")
        codes = []
        for mod in (kernel, sch.mod):
            out = tvm.runtime.tensor(np.zeros(data.shape, "uint8"))
            tvm.compile(mod, target=TARGET)(tvm.runtime.tensor(data), tvm.runtime.tensor(np.full(channels, 0.05, "float32")),
                                            tvm.runtime.tensor(np.full(channels, 7, "int32")), out)
            codes.append(out.numpy())
        np.testing.assert_array_equal(codes[0], codes[1])
        assert len(np.unique(codes[0])) > 50


class _Int8Task:  # what space_for reads of an extracted task; the kernel is made when a test asks for it
    @property
    def dispatched(self) -> list[tvm.IRModule]:
        return [int8.matmul_u8s8(64, 64, 128)]


def _design_space(target: tvm.target.Target, space) -> list[str]:
    """The traces of a search space's design space for the int8 kernel on ``target`` (nothing is run)."""
    from tvm.s_tir import meta_schedule as ms

    context = ms.TuneContext(mod=_Int8Task().dispatched[0], target=target, space_generator=space, task_name="int8")
    return [str(s.trace) for s in context.generate_design_space()]


@pytest.mark.parametrize("mcpu", ["skylake-avx512", "alderlake", "haswell", "nehalem"])
def test_without_avx512_vnni_int8_kernels_get_the_course_avx2_intrinsic_or_none_and_their_own_databases(mcpu):
    """AVX-512 without VNNI (Skylake-X), AVX-VNNI without AVX-512 (Alder Lake), AVX2 (Haswell, Zen 3): the course's
    ``vpmaddubsw`` intrinsic and never one of TVM's; no AVX2 (Nehalem): LLVM's generic space, no intrinsic."""
    no_vnni = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    assert not int8.has_vnni(no_vnni)
    assert quantize.database_model(no_vnni) != quantize.database_model(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    traces = _design_space(no_vnni, quantize.space_for(no_vnni)(_Int8Task()))
    tensorized = [t for t in traces if "auto_tensorize" in t]
    if int8.int8_instruction(no_vnni) == "avx2":
        assert tensorized and all(int8.AVX2_INTRIN in t for t in tensorized), f"{mcpu}: not the course's AVX2 intrinsic"
        assert not any("dot_16x4" in t for t in traces)
    else:
        assert traces and not tensorized, f"{mcpu}: an int8 design space tensorizes"
    if int8.has_vnni(TARGET):
        assert any(int8.VNNI_INTRIN in t for t in _design_space(TARGET, quantize.space_for(TARGET)(_Int8Task())))


def test_tvms_default_space_would_put_its_saturating_avx512_intrinsic_into_int8_kernels_on_skylake_x():
    """Why ``int8.generic_space`` exists: if TVM stops doing this, revisit ``quantize.space_for``."""
    skylake_x = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    assert any("dot_16x4_avx512" in t for t in _design_space(skylake_x, "post-order-apply"))


@pytest.mark.skipif(not tvm.target.codegen.target_has_features("avx2", TARGET), reason="runs AVX2 code")
def test_int8_kernels_tuned_for_an_avx2_cpu_run_vpmaddubsw_and_are_exact_at_the_7_bit_extremes(tmp_path):
    haswell = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    top = int8.activation_max(haswell)
    m, n, k = 32, 32, 64
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    w[:, :8] = -128
    a = rng.integers(0, top + 1, (m, k)).astype(np.uint8)
    a[:, :8] = top  # pairs of 127 x -128 products: -32512, the most int16 has to hold
    bb = tvm.relax.BlockBuilder()
    x = tvm.relax.Var("x", tvm.relax.TensorType((m, k), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(int8.matmul_u8s8_compute, x, tvm.relax.const(int8.pack_weight(w), "int8")))
        bb.emit_func_output(out)
    mod = bb.get()
    tuning.tune(mod, haswell, tmp_path, max_trials_per_task=4, progress=False, prepack=False,
                space_for=quantize.space_for(haswell))
    executable = tuning.build_tuned(mod, haswell, tmp_path)
    got = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(a)).numpy()
    np.testing.assert_array_equal(got, a.astype(np.int64) @ w.T.astype(np.int64))
    executable.export_library(str(tmp_path / "avx2.so"))
    assert export.instruction_counts(tmp_path / "avx2.so", ["vpmaddubsw"])["vpmaddubsw"] > 0


def test_on_an_avx2_cpu_activations_are_quantized_to_7_bits_and_clipped_there(small):
    """An input past the calibrated range must not reach vpmaddubsw with a code above 127."""
    _, folded, ranges, x = small
    haswell = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    imported = models.import_to_relax(folded, x)
    for target, clips in ((haswell, len(ranges)), (tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}), 0)):
        quantized = quantize.quantize_pointwise_convs(imported, ranges, target=target)
        assert ir.op_histogram(quantized.mod).get("clip", 0) == clips, target
    assert quantize.activation_params(quantize.Range(-1.0, 3.0), 127) == pytest.approx((4.0 / 127, 32))


@pytest.mark.parametrize("mcpu", ["znver5", "haswell"])
def test_the_shipped_int8_databases_cover_every_kernel_of_the_course_model(mcpu):
    """Day 12 builds with them, one per int8 instruction (VNNI, AVX2): a change to the rewrite or the
    calibration must come with new databases."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    _, quantized, _ = quantize.quantized_model(target=target)
    assert_every_kernel_covered(quantized.mod, target, quantize.database_model(target),
                                f"python -m helpers.maintainers.shipping int8 16 --mcpu {mcpu}")


def test_onnx_runtimes_int8_quantizes_every_convolution_with_the_courses_kinds_of_number_and_both_engines_run_it(small):
    import onnx

    model, _, _, x = small
    inputs = [torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    quantized = onnx.load_from_string(quantize.onnx_int8(model, inputs, example=x))
    nodes = quantized.graph.node
    initializers = {t.name: t for t in quantized.graph.initializer}
    convs = [n for n in nodes if n.op_type == "Conv"]
    assert len(convs) == 5  # stem, expand, depthwise, project, skip: every convolution, depthwise included
    produced_by = {out: n for n in nodes for out in n.output}
    for conv in convs:
        data, weight = (produced_by[name] for name in conv.input[:2])
        assert data.op_type == weight.op_type == "DequantizeLinear", f"{conv.name}: its input and weight should be int8"
        zero_point = initializers[data.input[2]]
        assert zero_point.data_type == onnx.TensorProto.UINT8, "activations in uint8, one scale per tensor"
        assert len(initializers[data.input[1]].dims) == 0
        weight_scale = initializers[weight.input[1]]
        assert initializers[weight.input[0]].data_type == onnx.TensorProto.INT8 and weight_scale.dims[0] == conv_out(conv, initializers, weight), (
            "weights in int8, one scale per output channel")
    engines, missing = quantize.onnx_int8_engines(quantized.SerializeToString())
    assert missing == {} and sorted(engines) == sorted([quantize.ORT_INT8, quantize.OPENVINO_INT8])
    with torch.no_grad():
        expected = model(x).numpy()
    ort, openvino = (engines[label](x) for label in (quantize.ORT_INT8, quantize.OPENVINO_INT8))
    ort_error = build.relative_error(ort, expected)
    assert 0 < ort_error < 0.3, "ONNX Runtime's int8 should stay near float32, and not be it"
    # Both engines run the same quantized model, so OpenVINO's int8 is as near float32 as ONNX Runtime's. Where the
    # CPU has VNNI their kernels agree closely; on AVX2 alone they round differently, a step apart on this small
    # model (measured on a Zen 3: each 0.165 from float32, 0.124 from each other), and only the first holds.
    assert 0 < build.relative_error(openvino, expected) < 1.25 * ort_error + 0.02, (
        "OpenVINO runs the same int8 model: it should be as near float32 as ONNX Runtime's")
    if int8.int8_instruction(machine.cpu_target()) == "vnni":
        assert build.relative_error(openvino, ort) < 0.05, "OpenVINO runs the same int8 model: on VNNI it should agree with ONNX Runtime"


def conv_out(conv, initializers, weight) -> int:
    """The output channels of a quantized convolution: the first dimension of its int8 weight."""
    return initializers[weight.input[0]].dims[0]
