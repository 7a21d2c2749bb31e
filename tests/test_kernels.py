import os

os.environ.setdefault("TVM_NUM_THREADS", "2")

import numpy as np
import pytest
from tvm import s_tir

from helpers import kernels, machine


def test_peak_and_lanes():
    assert kernels.peak_gflops(2, 2.5, 16, 2) == 2 * 2.5 * 2 * 2 * 16
    assert kernels.float32_lanes() in (2, 4, 8, 16)
    with pytest.raises(ValueError, match="ghz"):
        kernels.peak_gflops(1, 0.0, 8, 2)
    with pytest.raises(ValueError, match="fma_units"):
        kernels.peak_gflops(1, 1.0, 8, 0)


def test_estimated_peak_uses_the_fma_table_and_physical_cores():
    import tvm

    zen4 = kernels.estimated_peak(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}), cores=2, ghz=3.0)
    zen5 = kernels.estimated_peak(tvm.target.Target({"kind": "llvm", "mcpu": "znver5"}), cores=2, ghz=3.0)
    assert zen4.gflops == 2 * 3.0 * 32 and zen5.gflops == 2 * 3.0 * 64  # Zen 4 halves 512-bit FMAs
    assert "znver4" in zen4.explain() and "256-bit" in zen4.explain() and "reported by the OS" in zen4.explain()
    here = kernels.estimated_peak()
    assert here.cores == machine.physical_core_count() and here.fma.cpu == machine.cpu_name()
    assert here.gflops > 0 and ("reported" in here.explain() or "assumed" in here.explain())


def test_packing_round_trips_and_puts_channels_innermost():
    x = np.arange(1 * 32 * 3 * 5, dtype=np.float32).reshape(1, 32, 3, 5)
    packed = kernels.pack_nchwc(x, 8)
    assert packed.shape == (1, 4, 3, 5, 8)
    assert packed[0, 2, 1, 4, 5] == x[0, 2 * 8 + 5, 1, 4]
    assert np.array_equal(kernels.unpack_nchwc(packed), x)
    w = np.arange(16 * 8, dtype=np.float32).reshape(16, 8, 1, 1)
    assert kernels.pack_weight(w, 4)[3, 1, 0, 0, 2, 1] == w[3 * 4 + 1, 1 * 4 + 2, 0, 0]
    with pytest.raises(kernels.KernelShapeError, match="multiples of the block"):
        kernels.pack_nchwc(np.zeros((1, 12, 2, 2), np.float32), 8)
    with pytest.raises(kernels.KernelShapeError, match="positive integer"):
        kernels.PointwiseShape(0, 8, 2, 2)


def test_run_function_shows_elements_never_written_and_names_a_wrong_input():
    from tvm import te

    x = te.placeholder((4,), name="x")
    half = te.create_prim_func([x, te.compute((4,), lambda i: x[i] * 2, name="y")])
    assert kernels.buffer_shapes(half) == [(4,), (4,)]
    assert kernels.run_function(half, [np.arange(4, dtype=np.float32)]).tolist() == [0, 2, 4, 6]

    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def first_two(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(2):
            with T.sblock("copy"):
                vi = T.axis.remap("S", [i])
                b[vi] = a[vi]

    got = kernels.run_function(first_two, [np.ones(4, np.float32)])
    assert got[:2].tolist() == [1, 1] and np.isnan(got[2:]).all(), got
    with pytest.raises(kernels.KernelShapeError, match=r"input 0 has shape \(3,\)"):
        kernels.run_function(half, [np.ones(3, np.float32)])
    with pytest.raises(kernels.KernelShapeError, match="TensorIR function"):
        kernels.buffer_shapes(np.ones(3))


@pytest.mark.timed
def test_naive_and_scheduled_kernels_match_pytorch_and_the_schedule_is_faster():
    shape = kernels.PointwiseShape(96, 64, 7, 7)
    problem = kernels.PointwiseProblem.make(shape)
    naive = kernels.build(kernels.pointwise_nchwc(shape, 16))
    kernels.check(naive, problem, 16)
    kernels.check(kernels.build(kernels.pointwise_nchw(shape)), problem, None)
    sch = s_tir.Schedule(kernels.pointwise_nchwc(shape, 16))
    n, oco, h, w, oci, ico, ici = sch.get_loops(sch.get_sblock("conv"))
    sch.reorder(n, oco, h, ico, ici, w, oci)
    sch.vectorize(oci)
    sch.parallel(sch.fuse(n, oco, h))
    assert kernels.loop_nest(sch).startswith("parallel ") and "vectorized oc_inner(16)" in kernels.loop_nest(sch)
    fast = kernels.build(sch)
    kernels.check(fast, problem, 16)
    # On one thread, as grading times kernels (kernels.thread_pool): a parallel kernel waits for its slowest
    # thread, and with another program on the machine one of its threads shares a core (20x slower here).
    with kernels.thread_pool(1):
        timings = kernels.measure({"naive": kernels.tvm_runner(naive, problem.args(16)),
                                   "fast": kernels.tvm_runner(fast, problem.args(16))}, repeats=9, min_sample_ms=4)
    assert kernels.speedup(timings, "fast", "naive") > 2
    assert kernels.gflops(timings[0], shape.flops) > 0


def test_a_wrong_kernel_is_caught():
    shape = kernels.PointwiseShape(16, 16, 2, 2)
    problem = kernels.PointwiseProblem.make(shape)
    lib = kernels.build(kernels.pointwise_nchwc(shape, 16))
    problem.expected = problem.expected + 1.0
    with pytest.raises(kernels.KernelMismatchError, match="relative error"):
        kernels.check(lib, problem, 16)


def test_relax_module_has_one_conv():
    mod = kernels.pointwise_relax(kernels.PointwiseShape(16, 32, 4, 4))
    assert int(mod["main"].attrs["num_input"]) == 1


def test_thread_pool_sets_and_restores_tvm_threads():
    before = kernels.threads()
    with kernels.thread_pool(1):
        assert kernels.threads() == 1
    assert kernels.threads() == before
    with pytest.raises(ValueError, match="at least 1 thread"):
        with kernels.thread_pool(0):
            pass


def test_intensity_and_bandwidth():
    shape = kernels.PointwiseShape(c_in=8, c_out=16, h=2, w=2)
    assert shape.min_bytes == 4 * (8 * 4 + 8 * 16 + 16 * 4)
    assert shape.intensity == shape.flops / shape.min_bytes
    assert kernels.memory_bandwidth_gbs(megabytes=8, repeats=2) > 0.1


def test_reread_traffic_counts_what_each_loop_order_reads_again_and_the_cache_it_comes_from():
    shape = kernels.PointwiseShape(c_in=320, c_out=1280, h=7, w=7)
    caches = {"L1d": 32 * 1024, "L2": 1024**2, "L3": 32 * 1024**2}
    channels_first, rows_first = kernels.reread_traffic(shape, 16, caches)
    assert (channels_first["read again"], channels_first["times"], channels_first["from"]) == ("the input", 80, "L2")
    assert (rows_first["read again"], rows_first["times"], rows_first["from"]) == ("the weights", 7, "L3")
    moved = 80 * 4 * 320 * 49 + 4 * 320 * 1280 + 4 * 1280 * 49
    assert channels_first["FLOP/byte"] == pytest.approx(shape.flops / moved)
    assert rows_first["FLOP/byte"] < channels_first["FLOP/byte"] < shape.intensity
    assert kernels.served_by(4 * 320 * 1280, {"L2": 1024**2}) == "DRAM", "1.6 MB fits no cache of 1 MB"
