"""The register-tile sweep of a bf16 database (helpers.maintainers.register_tiles; issue 50)."""

import json

import numpy as np
import pytest
import tvm
from tvm import te

from helpers import bf16, bf16_model, build, machine, tuning
from helpers.maintainers import register_tiles

TARGET = machine.cpu_target()
needs_bf16 = pytest.mark.skipif(not bf16.has_bf16(TARGET), reason=f"{machine.cpu_name()} has no AVX-512 BF16")


@pytest.mark.parametrize("rows, cols, blocks", [(56, 56, 16), (14, 14, 16), (7, 7, 32), (28, 28, 4), (112, 112, 6)])
def test_the_tiles_tried_fit_the_registers_divide_the_output_and_load_least_per_product_first(rows, cols, blocks):
    tiles = register_tiles.inner_tiles(rows, cols, blocks)
    assert tiles, "no tile tried"
    for r, c, b in tiles:
        assert rows % r == 0 and cols % c == 0 and blocks % b == 0
        sums = r * c * b
        assert register_tiles.MIN_SUMS <= sums <= register_tiles.MAX_SUMS and sums + b + 1 <= register_tiles.REGISTERS
    loads = [(r * c + b) / (r * c * b) for r, c, b in tiles]
    assert loads == sorted(loads)


def test_a_tile_that_spills_is_never_tried_and_one_that_fits_is():
    assert not register_tiles.fits(7, 4)  # 28 sums + 4 weight vectors + a broadcast: 33 registers
    assert register_tiles.fits(7, 2) and register_tiles.fits(4, 4)
    assert (1, 7, 2) in register_tiles.inner_tiles(56, 56, 16, limit=100)
    assert not any(r * c == 7 and b == 4 for r, c, b in register_tiles.inner_tiles(56, 56, 16, limit=100))


@pytest.mark.parametrize("extent, tuned, inner", [(56, [1, 56, 1, 1], 7), (56, [2, 4, 7, 1], 4), (16, [4, 2, 1, 2], 2)])
def test_a_retiled_axis_keeps_its_extent_and_its_innermost_tile(extent, tuned, inner):
    tile = register_tiles._retile(extent, tuned, inner)
    assert int(np.prod(tile)) == extent and tile[-1] == inner and tile[2] == 1 and tile[0] <= max(1, tuned[0])


def _pointwise(rows: int, cols: int, channels: int, outputs: int) -> tvm.IRModule:
    A = te.placeholder((1, rows, cols, channels), "uint16", name="A")
    W = te.placeholder((outputs // bf16.LANES, channels // bf16.PAIR, bf16.LANES, bf16.PAIR), "uint16", name="W")
    C = bf16_model.pointwise_bf16_compute(A, W)
    return tvm.IRModule({"main": te.create_prim_func([A, W, C]).with_attr("global_symbol", "main")})


@needs_bf16
def test_a_swept_database_keeps_one_record_per_kernel_and_its_schedules_compute_the_same_products(tmp_path):
    from tvm.s_tir import meta_schedule as ms

    mod = _pointwise(2, 14, 64, 64)
    with tuning.quiet_metaschedule():
        ms.tir_integration.tune_tir(mod=mod, target=TARGET, work_dir=str(tmp_path / "tuned"), max_trials_global=2,
                                    num_trials_per_iter=2, space=bf16.bf16_space(), builder=tuning.InProcessBuilder(),
                                    runner=tuning.search.local_runner())
    rows = register_tiles.sweep_database(tmp_path / "tuned", tmp_path / "swept", TARGET)
    assert len(rows) == 1 and rows[0]["tried"] > 1 and rows[0]["swept_ms"] > 0
    summary = tuning.database_summary(tmp_path / "swept")
    assert summary["records"] == summary["workloads"] == 1 and summary["failed_records"] == 0
    assert json.loads((tmp_path / "swept" / tuning.SETTINGS_FILE).read_text())["register_tiles_swept"]["kernels"] == 1

    rng = np.random.default_rng(3)
    a = bf16.to_bits(rng.standard_normal((1, 2, 14, 64)).astype(np.float32))
    w = bf16.to_bits(rng.standard_normal((64, 64)).astype(np.float32))
    expected = bf16.from_bits(a).reshape(-1, 64) @ bf16.from_bits(w).T
    swept = ms.tir_integration.compile_tir(tuning.load_database(tmp_path / "swept"), mod, TARGET)
    lib = tvm.compile(swept.mod, target=TARGET)
    out = tvm.runtime.tensor(np.zeros((1, 2, 14, 64), np.float32))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(bf16.pack_weight(w)), out)
    assert build.relative_error(out.numpy().reshape(-1, 64), expected) < 1e-5  # the same products, in another order
    assert "vdpbf16ps" in lib.mod.inspect_source("asm")


@pytest.mark.parametrize("args, product", [
    ([("uint16", [1, 56, 56, 64]), ("uint16", [16, 32, 16, 2]), ("float32", [1, 56, 56, 256])], True),  # bf16
    ([("uint8", [1, 14, 14, 192]), ("int8", [4, 48, 16, 4]), ("float32", [64])], True),  # int8 on vpdpbusd
    ([("float32", [1, 56, 56, 64]), ("float32", [1, 1, 64, 64]), ("float32", [1, 56, 56, 64])], False),
    ([("uint16", [1, 56, 56, 64]), ("float32", [64, 3, 3, 1]), ("float32", [1, 56, 56, 64])], False),  # depthwise on bits
])
def test_the_kernels_swept_are_those_with_a_packed_bf16_or_int8_weight(args, product):
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo

    class Record:
        args_info = [TensorInfo(dtype, shape) for dtype, shape in args]

    assert register_tiles.is_product(Record()) is product
