"""bfloat16 products on AMX tiles (helpers.amx): their configuration, their machine code on any machine, and
their numbers where the CPU has AMX."""

import numpy as np
import pytest
import tvm

from helpers import amx, bf16, export, machine
from helpers.errors import CourseError

from bf16_reference import exact_product, matmul_error

TARGET = machine.cpu_target()
SAPPHIRE_RAPIDS = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
needs_amx = pytest.mark.skipif(not amx.has_amx(TARGET), reason=f"{machine.cpu_name()} has no AMX")


def test_only_cpus_with_amx_bf16_tiles_have_amx():
    assert amx.has_amx(SAPPHIRE_RAPIDS)
    assert not amx.has_amx(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))  # AVX-512 BF16, no tiles
    assert not amx.has_amx(tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake"}))
    assert amx.has_amx(tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+amx-tile", "+amx-bf16"]}))


def test_the_tile_configuration_gives_the_reductions_tail_its_own_tiles():
    config = amx.tile_config(46)  # one step of 32, a tail of 14
    assert len(config) == 64 and config[0] == 1
    row_bytes = [int.from_bytes(config[16 + 2 * t:18 + 2 * t], "little") for t in range(8)]
    rows = list(config[48:56])
    assert row_bytes == [64, 64, 64, 64, 64, 28, 28, 64] and rows == [16, 16, 16, 16, 16, 16, 16, 7]
    untailed = amx.tile_config(64)
    assert list(untailed[48:56]) == [16] * 5 + [0] * 3  # no tail: those tiles are left unconfigured


def test_shapes_it_cannot_take_are_refused_with_the_reason():
    with pytest.raises(CourseError, match="m >= 32"):
        amx.matmul_amx(16, 32, 64)
    with pytest.raises(CourseError, match="multiple of 16"):
        amx.matmul_amx(64, 24, 64)


def test_the_kernel_is_built_from_tile_instructions_on_any_machine(tmp_path):
    lib = tvm.compile(amx.matmul_amx(40, 48, 46), target=SAPPHIRE_RAPIDS)  # building needs no AMX; running does
    path = tmp_path / "amx.so"
    lib.export_library(str(path))
    counts = export.instruction_counts(path, ["ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease"])
    assert all(counts.values()), counts


@needs_amx
@pytest.mark.parametrize("m, n, k", [(40, 48, 46), (49, 16, 2), (96, 32, 64)])
def test_products_on_tiles_are_exact_on_the_bf16_values_with_ragged_rows_and_reductions(m, n, k):
    amx.request_tiles()
    lib = tvm.compile(amx.matmul_amx(m, n, k), target=TARGET)
    error = matmul_error(lib["main"], m, n, k, seed=m + n + k)
    assert error < 1e-5, f"every row and column written, only the order of the sums differs ({error:.1e})"


def _operands(height: int, width: int, k: int, n: int, kind: amx.Kind):
    """A 1x1 convolution's activation (channels last) and its weight packed in tiles of 16 columns, of ``kind``."""
    from tvm import te

    A = te.placeholder((1, height, width, k), kind.left, name="A")
    W = te.placeholder((n // 16, k // kind.group, 16, kind.group), kind.right, name="W")
    return A, W


def _pointwise_kernel(height: int, width: int, k: int, n: int, epilogue: bool):
    """A bf16 1x1 convolution as the bf16 model writes it, with (``epilogue``) a bias, ReLU6 and the rounding of
    its output to bf16 after it, as fusion leaves them."""
    from tvm import te

    from helpers import bf16_model

    A, W = _operands(height, width, k, n, amx.BF16)
    C = bf16_model.pointwise_bf16_compute(A, W)
    if not epilogue:
        return te.create_prim_func([A, W, C])
    bias = te.placeholder((n,), "float32", name="bias")
    added = te.compute(C.shape, lambda b, i, j, c: C[b, i, j, c] + bias[c], name="add")
    clipped = te.compute(C.shape, lambda b, i, j, c: te.max(te.min(added[b, i, j, c], 6.0), 0.0), name="clip")
    return te.create_prim_func([A, W, bias, bf16_model.round_to_bits(clipped)])


def test_only_the_bf16_pointwise_kernels_are_put_on_tiles():
    kernel = _pointwise_kernel(7, 7, 46, 48, epilogue=True)
    mod = tvm.IRModule({"pointwise": kernel, "other": _pointwise_kernel(7, 7, 46, 48, epilogue=False).with_attr(
        "tirx.is_scheduled", True)})
    scheduled = amx.schedule_products(mod)
    assert scheduled["pointwise"].attrs["tirx.is_scheduled"] and "tdpbf16ps" in scheduled["pointwise"].script()
    assert "tdpbf16ps" not in scheduled["other"].script()  # already scheduled: left alone
    assert amx.tile_schedule_for(kernel) is amx.schedule_pointwise
    assert amx.tile_schedule_for(tvm.te.create_prim_func([tvm.te.placeholder((4,), "float32")])) is None
    assert amx.tile_schedule_for(_pointwise_kernel(1, 1, 240, 16, epilogue=True)) is None  # one pixel: left to tuning
    assert amx.tile_schedule_for(_pointwise_kernel(3, 19, 64, 16, epilogue=True)) is None  # tiles of one pixel too
    assert amx.tile_schedule_for(_pointwise_kernel(1, 2, 240, 16, epilogue=True)) is amx.schedule_pointwise


@needs_amx
@pytest.mark.parametrize("height, width, k, n, epilogue", [(5, 7, 46, 48, True), (3, 20, 64, 32, False), (2, 9, 24, 144, True),
                                                          (2, 3, 256, 96, True)])  # (weights 16x the input: cores split channels)
def test_a_pointwise_convolution_on_tiles_matches_the_bf16_arithmetic_with_its_epilogue(height, width, k, n, epilogue):
    sch = tvm.s_tir.Schedule(_pointwise_kernel(height, width, k, n, epilogue))
    amx.schedule_pointwise(sch)
    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(k + n)
    a, w, bias = rng.normal(size=(1, height, width, k)), rng.normal(size=(n, k)), rng.normal(size=n).astype(np.float32)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(bf16.to_bits(a.astype(np.float32)), dev),
            tvm.runtime.tensor(bf16.pack_weight(bf16.to_bits(w.astype(np.float32))), dev)]
    exact = exact_product(a.reshape(-1, k), w).reshape(1, height, width, n)
    if epilogue:
        out = tvm.runtime.tensor(np.zeros((1, height, width, n), np.uint16), dev)
        lib["main"](*args, tvm.runtime.tensor(bias, dev), out)
        want = bf16.to_bits(np.clip(exact + bias, 0, 6).astype(np.float32))
        assert np.abs(out.numpy().astype(np.int32) - want.astype(np.int32)).max() <= 1  # one bf16 step: sums' order
    else:
        out = tvm.runtime.tensor(np.full((1, height, width, n), np.nan, np.float32), dev)
        lib["main"](*args, out)
        assert np.abs(out.numpy() - exact).max() / np.abs(exact).max() < 1e-5


@needs_amx
@pytest.mark.parametrize("size, channels, out, kernel, stride, padding", [
    (9, 6, 48, 3, 1, 1),   # a 3x3 convolution, the reduction's tail only (6 channels)
    (11, 64, 32, 3, 2, 1),  # strided: each tile's input pixels two apart in memory
    (10, 40, 16, 1, 2, 0),  # a strided 1x1 (ResNet's shortcut): unit loops over the taps
    (12, 3, 32, 3, 2, 1),  # a stem: 3 channels, padded to 4, a row of 3 taps in one product
    (16, 3, 64, 7, 2, 3),  # ResNet's stem: a row of 7 taps x 4 channels in one product
    (5, 128, 64, 3, 1, 1),  # weights 23x the input: the cores split the output channels, not the rows
])
def test_a_convolution_on_tiles_is_pytorchs_on_the_bf16_values(size, channels, out, kernel, stride, padding):
    import torch
    from tvm import te

    from helpers import bf16_model

    X = te.placeholder((1, size, size, channels), "uint16", name="X")
    weight = np.random.default_rng(size).normal(size=(out, kernel, kernel, channels)).astype(np.float32)
    packed = bf16_model.pack_conv_weight(weight)
    W = te.placeholder(packed.shape, "uint16", name="W")
    func = te.create_prim_func([X, W, bf16_model.conv_bf16_compute(X, W, (stride, stride), (padding,) * 4)])
    assert amx.tile_schedule_for(func) is amx.schedule_conv
    sch = tvm.s_tir.Schedule(func)
    amx.schedule_conv(sch)
    lib = tvm.compile(sch.mod, target=TARGET)
    x = np.random.default_rng(channels).normal(size=(1, size, size, channels)).astype(np.float32)
    side = (size + 2 * padding - kernel) // stride + 1
    dev = tvm.cpu()
    got = tvm.runtime.tensor(np.full((1, side, side, packed.shape[0] * 16), np.nan, np.float32), dev)
    lib["main"](tvm.runtime.tensor(bf16.to_bits(x), dev), tvm.runtime.tensor(packed, dev), got)
    as_bf16 = lambda a: torch.from_numpy(bf16.from_bits(bf16.to_bits(a)).astype(np.float64)).permute(0, 3, 1, 2)
    want = torch.nn.functional.conv2d(as_bf16(x), as_bf16(weight), stride=stride, padding=padding).permute(0, 2, 3, 1).numpy()
    assert np.abs(got.numpy()[..., :out] - want).max() / np.abs(want).max() < 1e-5
    assert not got.numpy()[..., out:].any()  # the padded output channels: zero weights, zero sums


def _int8_pointwise_kernel(height: int, width: int, k: int, n: int, epilogue: bool):
    """An int8 1x1 convolution as Day 12's int8 model writes it (uint8 activations, a packed int8 weight, int32 sums),
    with (``epilogue``) its dequantization to float32 and a ReLU after it, as fusion leaves them."""
    from tvm import te

    from helpers import int8

    A, W = _operands(height, width, k, n, amx.INT8)
    C = int8.matmul_u8s8_compute(A, W)
    if not epilogue:
        return te.create_prim_func([A, W, C])
    scale = te.placeholder((n,), "float32", name="scale")
    real = te.compute(C.shape, lambda b, i, j, c: C[b, i, j, c].astype("float32") * scale[c], name="dequantize")
    return te.create_prim_func([A, W, scale, te.compute(C.shape, lambda *i: te.max(real(*i), 0.0), name="relu")])


def test_int8_pointwise_kernels_go_on_tiles_only_where_asked_and_are_built_from_tdpbusd(tmp_path):
    assert amx.kinds_on(SAPPHIRE_RAPIDS) == (amx.BF16, amx.INT8)
    assert amx.kinds_on(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})) == ()  # AVX-512 VNNI and BF16, no tiles
    kernel = _int8_pointwise_kernel(7, 7, 100, 48, epilogue=True)
    assert amx.tile_schedule_for(kernel) is amx.schedule_pointwise
    mod = tvm.IRModule({"int8": kernel, "bf16": _pointwise_kernel(7, 7, 46, 48, epilogue=True)})
    bf16_only = amx.schedule_products(mod, (amx.BF16,))
    assert "tdpbusd" not in bf16_only["int8"].script() and "tdpbf16ps" in bf16_only["bf16"].script()
    both = amx.schedule_products(mod, amx.kinds_on(SAPPHIRE_RAPIDS))
    lib = tvm.compile(tvm.IRModule({"main": both["int8"]}), target=SAPPHIRE_RAPIDS)  # building needs no AMX
    lib.export_library(str(tmp_path / "int8.so"))
    counts = export.instruction_counts(tmp_path / "int8.so", ["ldtilecfg", "tileloadd", "tdpbusd", "tilestored"])
    assert all(counts.values()), counts


@needs_amx
@pytest.mark.parametrize("height, width, k, n, epilogue", [(5, 7, 100, 48, False), (3, 20, 36, 16, True),
                                                          (2, 9, 64, 144, True), (2, 3, 512, 96, False)])
def test_an_int8_pointwise_convolution_on_tiles_is_exact(height, width, k, n, epilogue):
    """Whole and partial 64-byte steps of the reduction, one or two tiles of columns, ragged rows: integer sums exact."""
    from helpers import int8

    assert amx.has_amx(TARGET, amx.INT8)
    sch = tvm.s_tir.Schedule(_int8_pointwise_kernel(height, width, k, n, epilogue))
    amx.schedule_pointwise(sch)
    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(k + n)
    a = rng.integers(0, 256, (1, height, width, k)).astype(np.uint8)
    w = rng.integers(-127, 128, (n, k)).astype(np.int8)
    scale = rng.uniform(1e-4, 1e-3, n).astype(np.float32)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev), tvm.runtime.tensor(int8.pack_weight(w), dev)]
    sums = a.reshape(-1, k).astype(np.int64) @ w.astype(np.int64).T
    if epilogue:
        out = tvm.runtime.tensor(np.full((1, height, width, n), np.nan, np.float32), dev)
        lib["main"](*args, tvm.runtime.tensor(scale, dev), out)
        want = np.maximum(sums.astype(np.float32) * scale, 0)
        np.testing.assert_allclose(out.numpy().reshape(-1, n), want, rtol=1e-6)
    else:
        out = tvm.runtime.tensor(np.zeros((1, height, width, n), np.int32), dev)
        lib["main"](*args, out)
        assert np.array_equal(out.numpy().reshape(-1, n), sums)
