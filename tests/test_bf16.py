"""bfloat16 kernels on AVX-512 BF16's vdpbf16ps (helpers.bf16): exact, in the assembly, refused where they cannot run."""

import ml_dtypes
import numpy as np
import pytest
import tvm

from helpers import amx, bf16, export, machine
from helpers.errors import CourseError

from bf16_reference import exact_product, matmul_error

TARGET = machine.cpu_target()
needs_bf16 = pytest.mark.skipif(not bf16.has_bf16(TARGET), reason=f"{machine.cpu_name()} has no AVX-512 BF16")


def test_bits_round_to_nearest_even_and_widen_exactly():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 3.0e38], np.float32)
    bits = bf16.to_bits(x)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bf16.from_bits(bits), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert bf16.from_bits(bits)[1] == 1.0 and bf16.from_bits(bits)[2] == 1.0 + 2 ** -6  # ties to even


def test_pack_weight_makes_each_16x2_tile_contiguous_and_refuses_a_ragged_weight():
    w = np.arange(32 * 6, dtype=np.uint16).reshape(32, 6)
    packed = bf16.pack_weight(w)
    assert packed.shape == (2, 3, 16, 2) and packed[1, 2, 5, 1] == w[16 + 5, 2 * 2 + 1]
    with pytest.raises(CourseError, match="multiple of 16"):
        bf16.pack_weight(np.zeros((24, 6), np.uint16))


@needs_bf16
@pytest.mark.parametrize("m, n, k", [(14, 32, 64), (9, 48, 18)])
def test_a_tensorized_matmul_runs_vdpbf16ps_and_matches_float32_on_the_same_bf16_values(m, n, k, tmp_path):
    lib = tvm.compile(bf16.tensorize_matmul(bf16.matmul_bf16(m, n, k), rows=min(m, 7)), target=TARGET)
    error = matmul_error(lib["main"], m, n, k, seed=k)
    assert error < 1e-5, f"the products of bf16 values are exact in float32: only the order of the sums differs ({error:.1e})"
    path = tmp_path / "bf16.so"
    lib.export_library(str(path))
    counts = export.instruction_counts(path, ["vdpbf16ps", "vfmadd231ps"])
    assert counts["vdpbf16ps"] > 0, counts


def test_a_cpu_without_avx512_bf16_is_told_so():
    assert bf16.has_bf16(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    assert not bf16.has_bf16(tvm.target.Target({"kind": "llvm", "mcpu": "znver3"}))
    assert not bf16.has_bf16(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}))


@needs_bf16
def test_metaschedule_tunes_a_bf16_product_around_the_intrinsic_and_keeps_its_numbers(tmp_path):
    from helpers.maintainers import bf16_kernels

    m, n, k = 14, 32, 64
    types = [((m, k), "uint16"), ((n // 16, k // 2, 16, 2), "uint16"), ((m, n), "float32")]
    executable = bf16_kernels.tune_kernel(bf16.matmul_bf16(m, n, k), types, bf16.bf16_space(), 2, TARGET)
    executable.export_library(str(tmp_path / "tuned.so"))
    assert export.instruction_counts(tmp_path / "tuned.so", ["vdpbf16ps"])["vdpbf16ps"] > 0, "the tuned kernel is tensorized"
    rng = np.random.default_rng(1)
    a, w = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(n, k)).astype(np.float32)
    dev = tvm.cpu()
    run = tvm.relax.VirtualMachine(executable, dev)["main"]
    out = run(tvm.runtime.tensor(bf16.to_bits(a), dev), tvm.runtime.tensor(bf16.pack_weight(bf16.to_bits(w)), dev))
    want = exact_product(a, w)
    assert np.abs(out.numpy() - want).max() / np.abs(want).max() < 1e-5


@needs_bf16
def test_the_bf16_table_times_four_engines_per_product_with_their_errors():
    from helpers.maintainers import bf16_kernels

    def hand_scheduled(mod, types, _space, _trials, target):  # tuning stands aside: the test above tunes
        is_bf16 = types[0][1] == "uint16"  # bf16 bits
        return tvm.compile(bf16_kernels.relax_call(bf16.tensorize_matmul(mod) if is_bf16 else mod, types), target=target)

    result = bf16_kernels.bf16_run(shapes=[(35, 32, 64)], trials=1, repeats=3, tune=hand_scheduled)
    (row,) = result["rows"]
    on_amx = {bf16_kernels.AMX_ENGINE} if amx.has_amx(TARGET) else set()  # AMX tiles join where the CPU has them
    assert set(row["engines"]) == set(bf16_kernels.ENGINES) | on_amx
    assert row["errors"]["TVM float32 tuned"] < 1e-5 and 1e-4 < row["errors"]["TVM bf16 tuned"] < 1e-2
    assert all(1e-4 < row["errors"][label] < 1e-2 for label in on_amx)
    text = bf16_kernels.format_bf16(result, "a test machine")
    assert "| 35 x 64 . 64 x 32 | TVM bf16 tuned |" in text
    assert ("amx.matmul_amx" in text) == bool(on_amx)
