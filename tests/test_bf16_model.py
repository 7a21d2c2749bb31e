"""A model's convolutions in bfloat16 (helpers.bf16_model): real builds of a small model, tuned around
vdpbf16ps where the CPU has it."""

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm

from helpers import amx, bf16, bf16_model, build, export, ir, machine, models, nchwc, quantize, tuning
from helpers.errors import CourseError

from shipped_databases import assert_every_kernel_covered
from test_quantize import Pointwise

TARGET = machine.cpu_target()
needs_bf16 = pytest.mark.skipif(not bf16.has_bf16(TARGET), reason=f"{machine.cpu_name()} has no AVX-512 BF16")


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    model = quantize.with_batchnorm_statistics(Pointwise().eval(), inputs)
    x = torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(9))
    return model, bf16_model.import_bf16(model, x), x


def test_rounding_in_tir_is_numpys_round_to_nearest_even_bit_for_bit():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=4000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 4000),
                        np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 0.0, -0.0, 3.0e38], np.float32)]
                       ).astype(np.float32)
    from tvm import te

    A = te.placeholder(x.shape, "float32", name="A")
    lib = tvm.compile(te.create_prim_func([A, bf16_model.round_to_bits(A)]), target=TARGET)
    out = tvm.runtime.tensor(np.zeros(x.shape, np.uint16))
    lib(tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), x.astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("depthwise, all_convs", [(True, True), (False, False)])
def test_every_convolution_runs_in_bf16_and_the_model_stays_close_to_float32(small, depthwise, all_convs):
    model, _, x = small
    half = bf16_model.convs_to_bf16(models.import_to_relax(quantize.fold_batch_norms(model), x), depthwise, all_convs)
    ops = ir.op_histogram(half.mod)
    # each convolution without groups a rounding and a bf16 product (three pointwise and the stem, or the pointwise
    # ones only); the depthwise one a rounding and a convolution of bits, or left to Relax
    assert (ops["nn.conv2d"], ops["call_tir"]) == ((0, 10) if all_convs else (2, 6))
    assert half.params == []
    with torch.no_grad():
        want = model(x).numpy()
    error = build.relative_error(build.compile_model(half)(x), want)
    assert 1e-5 < error < 2e-2, f"bf16 is {error:.3g} away from float32"  # rounded (not float32), and close


class Residual(torch.nn.Module):
    """A block's input read by its first convolution and added to its output: a residual stream."""

    def __init__(self, channels: int = 16):
        super().__init__()
        c = channels
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, c, 3, padding=1), torch.nn.BatchNorm2d(c), torch.nn.ReLU())
        self.conv1, self.conv2 = torch.nn.Conv2d(c, c, 1), torch.nn.Conv2d(c, c, 3, padding=1)
        self.head = torch.nn.Conv2d(c, 8, 1)

    def forward(self, x):
        s = self.stem(x)
        return self.head(torch.relu(self.conv2(torch.relu(self.conv1(s)))) + s)


def test_a_residual_stream_in_bits_is_rounded_once_and_added_from_its_bits():
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    model = quantize.with_batchnorm_statistics(Residual().eval(), inputs)
    x = inputs[0][:1]
    with torch.no_grad():
        want = model(x).numpy()
    outputs = {}
    for on_tiles in (False, True):  # on tiles, the residual stream is kept in bits
        half = bf16_model.import_bf16(model, x, on_tiles=on_tiles)
        callees = [str(call.args[0].name_hint) for call in ir.calls(half.mod, "call_tir")]
        roundings, widenings = (sum(name.startswith(kind) for name in callees) for kind in ("to_bf16", "from_bf16"))
        # four convolutions, each reading its input rounded; on tiles the addition reads the stem's bits
        assert (roundings, widenings) == (4, 1 if on_tiles else 0)
        outputs[on_tiles] = build.compile_model(half)(x)
        error = build.relative_error(outputs[on_tiles], want)
        assert 1e-5 < error < 2e-2, f"on_tiles={on_tiles}: bf16 is {error:.3g} away from float32"
    assert not np.array_equal(outputs[False], outputs[True])  # the addition's input rounded, or not


def test_a_strided_padded_convolution_of_bits_is_pytorchs_on_the_rounded_values():
    from tvm import te

    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(1, 11, 9, 3)).astype(np.float32), rng.normal(size=(20, 3, 3, 3)).astype(np.float32)
    X, W = te.placeholder(x.shape, "uint16", name="X"), te.placeholder((2, 3, 3, 2, 16, 2), "uint16", name="W")
    out = bf16_model.conv_bf16_compute(X, W, (2, 2), (1, 1, 0, 1))
    lib = tvm.compile(te.create_prim_func([X, W, out]), target=TARGET)
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], np.float32))
    lib(tvm.runtime.tensor(bf16.to_bits(x)), tvm.runtime.tensor(bf16_model.pack_conv_weight(w)), got)
    rounded = lambda a: torch.from_numpy(bf16.from_bits(bf16.to_bits(a)))  # noqa: E731
    want = torch.nn.functional.conv2d(torch.nn.functional.pad(rounded(x).permute(0, 3, 1, 2), (1, 1, 1, 0)),
                                      rounded(w).permute(0, 3, 1, 2), stride=2).permute(0, 2, 3, 1).numpy()
    assert got.shape == (1, 5, 5, 32)  # 20 output channels padded to 32
    np.testing.assert_allclose(got.numpy()[..., :20], want, rtol=1e-5, atol=1e-5)
    assert not got.numpy()[..., 20:].any()


@pytest.mark.parametrize("strides, padding", [((1, 1), (1, 1, 1, 1)), ((2, 2), (0, 1, 2, 1))])
def test_a_depthwise_convolution_of_bits_is_pytorchs_on_the_rounded_input(strides, padding):
    from tvm import te

    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(1, 9, 7, 16)).astype(np.float32), rng.normal(size=(16, 3, 3, 1)).astype(np.float32)
    channels_last = quantize.depthwise_weight_channels_last(w)  # [kh, kw, C], as the rewrite passes it
    X, W = te.placeholder(x.shape, "uint16", name="X"), te.placeholder(channels_last.shape, "float32", name="W")
    out = bf16_model.depthwise_from_bits_compute(X, W, strides, padding)
    lib = tvm.compile(te.create_prim_func([X, W, out]), target=TARGET)
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], np.float32))
    lib(tvm.runtime.tensor(bf16.to_bits(x)), tvm.runtime.tensor(channels_last), got)
    top, left, bottom, right = padding
    rounded = torch.from_numpy(bf16.from_bits(bf16.to_bits(x))).permute(0, 3, 1, 2)
    want = torch.nn.functional.conv2d(torch.nn.functional.pad(rounded, (left, right, top, bottom)),
                                      torch.from_numpy(w).permute(0, 3, 1, 2), stride=strides, groups=16)
    np.testing.assert_allclose(got.numpy(), want.permute(0, 2, 3, 1).numpy(), rtol=1e-5, atol=1e-5)


class SqueezeExcite(torch.nn.Module):
    """A convolution, then EfficientNet's squeeze-and-excite: each channel's mean over the positions scales it."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.squeeze, self.excite = torch.nn.Conv2d(16, 4, 1), torch.nn.Conv2d(4, 16, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y * torch.sigmoid(self.excite(torch.relu(self.squeeze(y.mean((2, 3), keepdim=True)))))


@pytest.mark.parametrize("size, as_product", [(12, True), (3, False)])  # 144 or 9 positions, 16 channels
def test_a_mean_over_more_positions_than_channels_becomes_a_product_and_the_model_keeps_its_numbers(size, as_product):
    torch.manual_seed(0)
    model = SqueezeExcite().eval()
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(5))
    half = bf16_model.import_bf16(model, x)
    callees = [str(call.args[0].name_hint) for call in ir.calls(half.mod, "call_tir")]
    assert (ir.op_histogram(half.mod)["mean"], "mean_as_product" in callees) == ((0, True) if as_product else (1, False))
    with torch.no_grad():
        want = model(x).numpy()
    error = build.relative_error(build.compile_model(half)(x), want)
    assert 1e-5 < error < 2e-2, f"bf16 is {error:.3g} away from float32"


def test_the_mean_as_a_product_is_numpys_mean():
    from tvm import te

    x = np.random.default_rng(6).normal(loc=0.5, size=(1, 20, 13, 24)).astype(np.float32)
    X, S = te.placeholder(x.shape, "float32", name="X"), te.placeholder((20, 13), "float32", name="S")
    lib = tvm.compile(te.create_prim_func([X, S, bf16_model.spatial_mean_product_compute(X, S)]), target=TARGET)
    got = tvm.runtime.tensor(np.zeros((1, 1, 1, 24), np.float32))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(np.full((20, 13), 1 / 260, np.float32)), got)
    np.testing.assert_allclose(got.numpy(), x.mean(axis=(1, 2), keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("classes", [70, 128])
def test_a_classifier_is_a_product_of_bits_padded_to_whole_groups_of_tiles(classes):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, classes)).eval()
    x = torch.randn(1, 3, 8, 8)
    imported = models.import_to_relax(model, x)
    assert ir.op_histogram(bf16_model.convs_to_bf16(imported, linear=False).mod)["matmul"] == 1
    half = bf16_model.convs_to_bf16(imported, all_convs=False)  # the 3x3 convolution left in float32
    assert (ir.op_histogram(half.mod)["matmul"], ir.op_histogram(half.mod)["nn.conv2d"]) == (0, 1)
    products = [f for gv, f in half.mod.functions.items() if gv.name_hint.startswith("bf16_linear")]
    assert len(products) == 1
    assert [int(d) for d in products[0].params[-1].ty.shape] == [1, 128]  # 64 outputs a group
    with torch.no_grad():
        features = model[:4](x).numpy()
    rounded = lambda a: bf16.from_bits(bf16.to_bits(a))
    want = rounded(features) @ rounded(model[4].weight.detach().numpy()).T + model[4].bias.detach().numpy()
    np.testing.assert_allclose(np.asarray(build.compile_model(half)(x)), want, rtol=1e-5, atol=1e-6)


def test_a_model_with_nothing_to_rewrite_is_refused():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(CourseError, match="no convolution to run in bfloat16"):
        bf16_model.convs_to_bf16(models.import_to_relax(model, x), all_convs=False)


def test_only_the_bf16_products_get_the_bf16_space_and_only_the_depthwise_ones_the_depthwise_space(small):
    _, half, _ = small
    tasks = tuning.extract_tasks(build.fuse(half.mod, TARGET), TARGET)
    chosen = {t.task_name: bf16_model.is_bf16_kernel(t) for t in tasks}
    assert sum(chosen.values()) == 4, chosen  # three pointwise convolutions and the stem
    assert all(("bf16_conv" in name) == is_product for name, is_product in chosen.items()), chosen
    depthwise = {t.task_name: nchwc.is_depthwise_nhwc(t) for t in tasks}
    assert sum(depthwise.values()) == 1 and all(("depthwise_from_bits" in n) == d for n, d in depthwise.items()), depthwise
    spaces = {t.task_name: bf16_model.space_for(t) for t in tasks}
    by_hand = 1 + sum(map(bf16_model.is_ragged_rounding, tasks))  # the depthwise one and the roundings alone
    assert sum(isinstance(space, type(nchwc.depthwise_nhwc_space())) for space in spaces.values()) == by_hand, spaces


@pytest.mark.parametrize("channels, ragged", [(24, True), (96, True), (64, False)])
def test_a_rounding_alone_whose_channels_split_metaschedules_vectors_gets_its_own_schedule_and_rounds_as_numpy(channels,
                                                                                                             ragged):
    from tvm import te

    model = Residual(channels).eval()  # the stem's output: read as bits by a convolution, in float32 by the addition
    half = bf16_model.import_bf16(model, torch.randn(1, 3, 6, 6))
    tasks = tuning.extract_tasks(build.fuse(half.mod, TARGET), TARGET)
    assert [bf16_model.is_ragged_rounding(t) for t in tasks].count(True) == int(ragged)
    by_hand = [isinstance(bf16_model.space_for(t), tvm.s_tir.meta_schedule.space_generator.ScheduleFn) for t in tasks]
    assert by_hand.count(True) == int(ragged)  # (the model has no depthwise convolution, the other schedule by hand)
    x = np.random.default_rng(7).normal(size=(1, 5, 7, channels)).astype(np.float32) * 3.0
    A = te.placeholder(x.shape, "float32", name="A")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, bf16_model.round_to_bits(A)]))
    quantize.schedule_quantize_nhwc(sch, "to_bf16")
    lib = tvm.compile(sch.mod, target=TARGET)
    out = tvm.runtime.tensor(np.zeros(x.shape, np.uint16))
    lib(tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def _bits_as_floats(bits: np.ndarray) -> np.ndarray:
    return bits.view(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_depthwise_schedule_keeps_the_kernels_numbers_whatever_tiles_it_samples(seed):
    """A depthwise convolution of bits with its epilogue, as fusion makes it, on odd sizes (15 rows, 10 columns, 48
    channels): every tile size ``nchwc.schedule_depthwise_nhwc`` samples gives the unscheduled kernel's output."""
    from tvm import te

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1, 15, 10, 48)).astype(ml_dtypes.bfloat16).view(np.uint16)
    w, bias = rng.normal(size=(3, 3, 48)).astype(np.float32), rng.normal(size=(48,)).astype(np.float32)
    X, W, B = te.placeholder(x.shape, "uint16", "X"), te.placeholder(w.shape, "float32", "W"), te.placeholder((48,), "float32", "B")
    conv = bf16_model.depthwise_from_bits_compute(X, W, (1, 1), (1, 1, 1, 1))
    zero, six = tvm.tirx.const(0.0, "float32"), tvm.tirx.const(6.0, "float32")
    clipped = te.compute(conv.shape, lambda *i: tvm.tirx.min(tvm.tirx.max(conv(*i) + B[i[3]], zero), six), name="clip")
    mod = tvm.IRModule({"main": te.create_prim_func([X, W, B, bf16_model.round_to_bits(clipped)])})
    sch = tvm.s_tir.Schedule(mod, seed=seed)
    nchwc.schedule_depthwise_nhwc(sch)
    assert any(inst.kind.name == "SamplePerfectTile" for inst in sch.trace.insts)
    outputs = []
    for scheduled in (mod, sch.mod):
        out = tvm.runtime.tensor(np.zeros(x.shape, np.uint16))
        tvm.compile(scheduled, target=TARGET)(*(tvm.runtime.tensor(a) for a in (x, w, bias)), out)
        outputs.append(_bits_as_floats(out.numpy()))
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=2 ** -7, atol=1e-6)  # sums in another order: one bf16 step


@needs_bf16
def test_tuning_puts_vdpbf16ps_into_the_products_and_keeps_the_numbers(small, tmp_path):
    _, half, x = small
    target = amx.without_tiles(TARGET) if amx.has_amx(TARGET) else TARGET  # (with AMX the products are not tuned)
    untuned = build.compile_model(half)(x)
    tuning.tune(half.mod, target, tmp_path / "db", max_trials_per_task=2, progress=False, space_for=bf16_model.space_for)
    executable = tuning.build_tuned(half.mod, target, tmp_path / "db")
    db = tuning.load_database(tmp_path / "db")
    for task in tuning.extract_tasks(build.fuse(half.mod, target), target):
        if bf16_model.is_bf16_kernel(task):  # every product, the stem's included, on the instruction
            best = db.get_top_k(db.commit_workload(task.dispatched[0]), 1)
            assert best and bf16.BF16_INTRIN in str(best[0].trace), task.task_name
    executable.export_library(str(tmp_path / "bf16.so"))
    assert export.instruction_counts(tmp_path / "bf16.so", ["vdpbf16ps"])["vdpbf16ps"] > 0
    tuned = build.load_executable(executable, half, target)(x)
    assert build.relative_error(tuned, untuned) < 1e-5  # the same products, summed in another order


@pytest.mark.skipif(not amx.has_amx(TARGET), reason=f"{machine.cpu_name()} has no AMX")
def test_with_amx_every_convolution_goes_onto_tiles_untuned_and_keeps_the_numbers(small, tmp_path):
    _, half, x = small
    untuned = build.compile_model(half)(x)
    from helpers.tuning.tasks import prepare

    fused = build.fuse(half.mod, TARGET)
    convolutions = {gv.name_hint for gv, f in fused.functions.items()
                    if isinstance(f, tvm.tirx.PrimFunc) and amx.tile_schedule_for(f) is not None}
    prepared = prepare(half.mod, TARGET, prepack=False)
    on_tiles = {gv.name_hint for gv, f in prepared.functions.items() if "tdpbf16ps" in str(f)}
    assert len(convolutions) >= 2 and on_tiles == convolutions  # the stem and the pointwise ones, all on tiles
    assert not any(bf16_model.is_bf16_kernel(task) for task in tuning.extract_tasks(prepared, TARGET))  # none tuned
    tuning.tune(half.mod, TARGET, tmp_path / "db", max_trials_per_task=1, progress=False, space_for=bf16_model.space_for)
    executable = tuning.build_tuned(half.mod, TARGET, tmp_path / "db")
    executable.export_library(str(tmp_path / "bf16.so"))
    assert export.instruction_counts(tmp_path / "bf16.so", ["tdpbf16ps"])["tdpbf16ps"] > 0
    tuned = build.load_executable(executable, half, TARGET)(x)
    assert build.relative_error(tuned, untuned) < 1e-5  # the same products, summed in another order


@pytest.mark.parametrize("model", ["mobilenet_v2", "resnet50", "efficientnet_b0"])
def test_the_shipped_bf16_databases_cover_every_kernel_of_their_model(model):
    """The bf16-model benchmark and Day 12 build with them: a change to the rewrite must come with new databases."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    float_model, _ = quantize.float_model(model)
    half = bf16_model.import_bf16(float_model, models.example_input())
    assert_every_kernel_covered(half.mod, target, bf16_model.database_name(model),
                                f"python -m helpers.maintainers.shipping bf16 16 --model {model}")


def test_the_bf16_table_names_each_engines_precision_and_the_fastest_engine_per_precision():
    from helpers import peers
    from helpers.maintainers import bf16_model_table as table

    def row(backend, median):
        return dict(backend=backend, median_ms=median, q1_ms=median * 0.95, q3_ms=median * 1.05, speedup=20 / median)

    openvino_bf16 = f"{peers.OPENVINO}{peers.DEFAULT_PRECISION}bf16"
    result = {"model": "mobilenet_v2", "held_out_images": 4, "missing": {}, "databases": {"bf16": "a", "fp32": "b"},
              "precision": {**table.PRECISION, openvino_bf16: "bf16"},
              "errors": {table.TVM_BF16: 3e-3},
              "rows": [row(peers.EAGER, 20.0), row(peers.OPENVINO, 6.0), row(table.TVM_FP32, 5.0),
                       row(table.FROZEN_BF16, 7.0), row(table.TVM_BF16, 4.0), row(openvino_bf16, 3.0)]}
    text = table.format_bf16_models({"models": [result]}, "a test machine")
    assert f"| {openvino_bf16} | bf16 | 3.00 (0.30) |" in text and f"| {table.TVM_FP32} | f32 | 5.00 (0.50) |" in text
    assert f"| {table.TVM_BF16} | {table.PRECISION[table.TVM_BF16]} | 4.00 (0.40) | 5.00x | 3.0e-03 |" in text
    assert "top-1" not in text and "agreement" not in text
    assert "Fastest float32 engine: TVM tuned (5.00 ms). Fastest bf16 engine: OpenVINO, default: bf16 (3.00 ms)." in text
    assert f"runs at 0.75x the fastest other bf16 engine ({openvino_bf16}) and 1.25x TVM's float32 build" in text
