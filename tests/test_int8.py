"""helpers.int8: the course's VNNI intrinsic builds on LLVM 22, computes exactly, uses vpdpbusd,
and refuses the weight layout that makes TVM's shipped intrinsics compute wrong results."""

import numpy as np
import pytest
import tvm

from helpers import int8, machine
from helpers.errors import CourseError

TARGET = machine.cpu_target()
needs_vnni = pytest.mark.skipif(not int8.has_vnni(TARGET), reason=f"{TARGET} has no AVX-512 VNNI")
HASWELL = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})  # AVX2, no AVX-512: a Zen 3's int8 path
needs_avx2 = pytest.mark.skipif(not tvm.target.codegen.target_has_features("avx2", TARGET), reason=f"{TARGET} has no AVX2")


@needs_vnni
def test_the_vnni_intrinsic_is_exact_on_8_bit_activations_and_emits_vpdpbusd():
    m, n, k = 8, 32, 64
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (m, k)).astype("uint8")  # full 8-bit range: vpdpbusd does not saturate
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    lib = tvm.compile(int8.tensorize_matmul(int8.matmul_u8s8(m, n, k), int8.register_vnni_intrinsic()), target=TARGET)
    out = tvm.runtime.tensor(np.zeros((m, n), "int32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(int8.pack_weight(w)), out)
    np.testing.assert_array_equal(out.numpy(), a.astype(np.int64) @ w.astype(np.int64).T)
    assert "vpdpbusd" in lib.mod.inspect_source("asm")


def _avx2_matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    m, k = a.shape
    lib = tvm.compile(int8.tensorize_matmul(int8.matmul_u8s8(m, w.shape[0], k), int8.AVX2_INTRIN), target=HASWELL)
    out = tvm.runtime.tensor(np.zeros((m, w.shape[0]), "int32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(int8.pack_weight(w)), out)
    assert "vpmaddubsw" in lib.mod.inspect_source("asm") and "zmm" not in lib.mod.inspect_source("asm")
    return out.numpy()


@needs_avx2
def test_the_avx2_intrinsic_is_exact_on_7_bit_activations_and_saturates_on_8_bit_ones():
    m, n, k = 8, 32, 64
    rng = np.random.default_rng(2)
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    w[:, :8] = -128  # the largest pair sums vpmaddubsw can meet: 2 x 127 x -128 = -32512 fits in int16
    a = rng.integers(0, int8.ACTIVATION_MAX_AVX2 + 1, (m, k)).astype("uint8")
    a[:, :8] = int8.ACTIVATION_MAX_AVX2
    np.testing.assert_array_equal(_avx2_matmul(a, w), a.astype(np.int64) @ w.astype(np.int64).T)
    a[:, :8] = 255  # 2 x 255 x -128 = -65280: saturated at -32768
    assert not np.array_equal(_avx2_matmul(a, w), a.astype(np.int64) @ w.astype(np.int64).T)


@pytest.mark.parametrize("mcpu, instruction, top", [("znver4", "vnni", 255), ("emeraldrapids", "vnni", 255),
                                                    ("haswell", "avx2", 127), ("skylake-avx512", "avx2", 127),
                                                    ("alderlake", "avx2", 127), ("nehalem", "generic", 255)])
def test_each_cpu_gets_the_int8_instruction_it_has_and_the_activation_range_it_takes(mcpu, instruction, top):
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    assert (int8.int8_instruction(target), int8.activation_max(target)) == (instruction, top)


def test_tensorize_matmul_names_the_intrinsics_it_knows_and_needs_the_lanes_of_another():
    with pytest.raises(CourseError, match="course_dot_8x4_avx2"):
        int8.tensorize_matmul(int8.matmul_u8s8(8, 32, 64), "dot_16x4_avx512")
    with pytest.raises(CourseError, match="a divisor of 16\\), got lanes=3"):
        int8.tensorize_matmul(int8.matmul_u8s8(8, 32, 64), "my_dot", lanes=3)


def test_the_intrinsic_refuses_an_unpacked_weight():
    """TVM's shipped descriptions accept this layout and compute wrong results; this one fails the build."""
    name = int8.register_vnni_intrinsic()
    with pytest.raises(Exception, match="buffer match constraint for B.strides"):
        tvm.compile(int8.tensorize_matmul(int8.matmul_u8s8(8, 32, 64, packed=False), name), target=TARGET)


def test_pack_weight_puts_each_16x4_tile_in_64_contiguous_bytes():
    w = np.arange(32 * 8).reshape(32, 8).astype("int8")
    packed = int8.pack_weight(w)
    assert packed.shape == (2, 2, 16, 4)
    assert np.array_equal(packed[1, 0].ravel(), w[16:32, 0:4].ravel())
    with pytest.raises(CourseError, match="multiple of 16"):
        int8.pack_weight(np.zeros((10, 8), "int8"))


@pytest.mark.parametrize("space", [int8.vnni_space, int8.avx2_space])
def test_the_int8_spaces_mutate_what_the_llvm_space_mutates(space):
    """Without mutators the evolutionary search only samples at random (issue 27)."""
    names = sorted(type(m).__name__ for m in space().mutator_probs)
    assert names == ["MutateComputeLocation", "MutateParallel", "MutateTileSize", "MutateUnroll"]


@needs_vnni
def test_metaschedule_tunes_around_the_intrinsic(tmp_path):
    from tvm.s_tir import meta_schedule as ms

    from helpers import tuning

    m, n, k = 16, 64, 64
    mod = int8.matmul_u8s8(m, n, k)
    with tuning.quiet_metaschedule():  # also closes the log handlers an earlier tuning run left behind
        database = ms.tir_integration.tune_tir(
            mod=mod, target=TARGET, work_dir=str(tmp_path), max_trials_global=8, num_trials_per_iter=8,
            space=int8.vnni_space(), builder=tuning.InProcessBuilder(), runner=tuning.search.local_runner(),
        )
    sch = ms.tir_integration.compile_tir(database, mod, TARGET)
    assert sch is not None, "no candidate was built and measured"
    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (m, k)).astype("uint8")
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    out = tvm.runtime.tensor(np.zeros((m, n), "int32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(int8.pack_weight(w)), out)
    np.testing.assert_array_equal(out.numpy(), a.astype(np.int64) @ w.astype(np.int64).T)
    assert "vpdpbusd" in lib.mod.inspect_source("asm")
