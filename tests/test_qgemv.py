"""Group-quantized weights and their matrix-vector product (helpers/qgemv.py): the course's quantizer is GGUF's
Q4_1 bit for bit, the TVM kernels are exact against NumPy on shapes and groups the course never shows, and the
roofline schedule beats TVM's own DLight rule by a wide margin in the same run."""

import os

os.environ.setdefault("TVM_NUM_THREADS", "2")

import gguf
import numpy as np
import pytest

from helpers import kernels, qgemv


def _weights(rows, cols, seed=0):
    w = np.random.default_rng(seed).normal(size=(rows, cols)).astype(np.float32)
    w[0, :] = 0.25   # a constant row: every group's step is 0
    return w


def test_the_course_quantizer_writes_gguf_q4_1_bit_for_bit():
    w = _weights(24, 256)
    theirs = qgemv.from_gguf_q4_1(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1), cols=256)
    mine = qgemv.quantize(w)
    for part in ("codes", "scale", "minimum"):
        assert np.array_equal(getattr(mine, part), getattr(theirs, part)), part
    want = gguf.quants.dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1),
                                  gguf.GGMLQuantizationType.Q4_1).reshape(w.shape)
    assert np.array_equal(theirs.dequantize(), want)


@pytest.mark.parametrize("group", [8, 64])
def test_every_weight_is_within_half_a_step_of_its_code(group):
    w = _weights(5, 192, seed=group)
    q = qgemv.quantize(w, group)
    step = np.repeat(q.scale.astype(np.float32), group, axis=1)
    # float16 scales and minimums add a rounding of their own: a thousandth of the group's range at most
    spread = np.repeat(np.ptp(w.reshape(5, -1, group), axis=-1), group, axis=1)
    assert np.all(np.abs(q.dequantize() - w) <= step / 2 + 2e-3 * spread + 1e-6)
    assert q.nbytes == 5 * 192 // 2 + 2 * 2 * 5 * 192 // group


def test_bad_groups_are_refused_with_what_to_do():
    with pytest.raises(qgemv.QuantizedShapeError, match="even size"):
        qgemv.quantize(np.zeros((2, 30), np.float32), group=15)
    with pytest.raises(qgemv.QuantizedShapeError, match="divides 100"):
        qgemv.quantize(np.zeros((2, 100), np.float32), group=32)
    with pytest.raises(qgemv.QuantizedShapeError, match="matrix"):
        qgemv.quantize(np.zeros(64, np.float32))


@pytest.mark.parametrize("rows,cols,group,rows_together", [(37, 96, 16, 2), (64, 256, 32, 4), (10, 64, 64, 3)])
def test_the_kernels_compute_the_dequantized_product(rows, cols, group, rows_together):
    q = qgemv.quantize(_weights(rows, cols, seed=rows), group)
    x = np.random.default_rng(1).normal(size=cols).astype(np.float32)
    want = q.dequantize().astype(np.float64) @ x
    func = qgemv.gemv(rows, cols, group)
    for kernel in (func, qgemv.roofline_schedule(func, rows_together)):
        got = qgemv.run(qgemv.build(kernel), q, x)
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_dlight_schedules_the_product_and_keeps_its_numbers():
    q = qgemv.quantize(_weights(32, 128), 32)
    x = np.linspace(-1, 1, 128, dtype=np.float32)
    got = qgemv.run(qgemv.build(qgemv.dlight_schedule(qgemv.gemv(32, 128))), q, x)
    assert np.allclose(got, q.dequantize() @ x, rtol=1e-4, atol=1e-4)


def test_the_read_bandwidth_is_measured_on_an_array_beyond_the_caches():
    gbs = qgemv.read_bandwidth_gbs(megabytes=64, repeats=2)
    assert 0.5 < gbs < 2000


@pytest.mark.timed
def test_the_roofline_schedule_reads_weights_far_faster_than_dlights():
    rows, cols = 1536, 576   # SmolLM2's MLP matrices
    q = qgemv.quantize(_weights(rows, cols), 32)
    x = np.ones(cols, np.float32)
    func = qgemv.gemv(rows, cols)
    libs = {"dlight": qgemv.build(qgemv.dlight_schedule(func)), "roofline": qgemv.build(qgemv.roofline_schedule(func))}
    # one thread, as the course times kernels: beside another program a parallel kernel waits for its slowest thread
    with kernels.thread_pool(1):
        timings = kernels.measure({name: kernels.tvm_runner(lib, qgemv.arguments(q, x)) for name, lib in libs.items()},
                                  repeats=7, min_sample_ms=4)
    assert kernels.speedup(timings, "roofline", "dlight") > 3, [str(t) for t in timings]


@pytest.mark.timed
def test_int8_dot_products_beat_the_float_schedule():
    rows, cols = 1536, 576
    q = qgemv.quantize(_weights(rows, cols), 32)
    x = np.random.default_rng(5).normal(size=cols).astype(np.float32)
    runners = {"float": kernels.tvm_runner(qgemv.build(qgemv.roofline_schedule(qgemv.gemv(rows, cols))),
                                           qgemv.arguments(q, x)),
               "int8": kernels.tvm_runner(qgemv.build(qgemv.int8_gemv(rows, cols)),
                                          qgemv.int8_arguments(q, qgemv.quantize_activation(x)))}
    with kernels.thread_pool(1):
        timings = kernels.measure(runners, repeats=7, min_sample_ms=4)
    assert kernels.speedup(timings, "int8", "float") > 1.3, [str(t) for t in timings]


def test_an_int8_activation_is_within_half_a_step_and_laid_out_for_the_nibbles():
    x = np.random.default_rng(4).normal(size=128).astype(np.float32)
    q = qgemv.quantize_activation(x)
    assert q.codes.shape == (128,) and q.codes.dtype == np.int8
    assert np.all(np.abs(q.dequantize() - x) <= np.repeat(q.scale, 32) / 2 + 1e-7)
    # pair 0, second half: values 16-31 of group 0, then 16-31 of group 1
    assert np.array_equal(q.codes[48:64], np.round(x[48:64] / q.scale[1]).astype(np.int8))
    assert np.allclose(q.sums, q.dequantize().reshape(-1, 32).sum(axis=1), rtol=1e-5, atol=1e-6)
    with pytest.raises(qgemv.QuantizedShapeError, match="multiple of 64"):
        qgemv.quantize_activation(np.zeros(96, np.float32))


INSTRUCTIONS = ["avx2"] + (["vnni"] if qgemv.int8.int8_instruction(qgemv.machine.cpu_target()) == "vnni" else [])


@pytest.mark.parametrize("instruction", INSTRUCTIONS)
@pytest.mark.parametrize("rows,cols,prefetch", [(12, 192, True), (40, 64, True), (12, 192, False)])
def test_the_int8_kernel_is_exact_on_the_quantized_vector(instruction, rows, cols, prefetch):
    q = qgemv.quantize(_weights(rows, cols, seed=cols))
    x = np.random.default_rng(2).normal(size=cols).astype(np.float32) * 3
    got = qgemv.run_int8(qgemv.build(qgemv.int8_gemv(rows, cols, instruction, prefetch_next=prefetch)), q, x)
    want = q.dequantize().astype(np.float64) @ qgemv.quantize_activation(x).dequantize()
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # against the float vector, the int8 step costs about 1 % here, not more
    exact = q.dequantize().astype(np.float64) @ x
    assert np.abs(got - exact).max() < 0.05 * np.abs(exact).max()


@pytest.mark.parametrize("instruction", INSTRUCTIONS)
def test_the_prompts_product_gives_each_token_what_the_step_gives_it(instruction):
    rows, cols, tokens = 20, 192, 8
    q = qgemv.quantize(_weights(rows, cols, seed=5))
    xs = np.random.default_rng(6).normal(size=(tokens, cols)).astype(np.float32) * 2
    got = qgemv.run_int8_tokens(qgemv.build(qgemv.int8_gemm(rows, cols, tokens, instruction)), q, xs)
    step = qgemv.build(qgemv.int8_gemv(rows, cols, instruction))
    want = np.stack([qgemv.run_int8(step, q, x) for x in xs])
    assert np.array_equal(got, want)   # the same sums in the same order: bit for bit
    assert len(set(map(tuple, got))) == tokens   # each token its own row of outputs
    with pytest.raises(qgemv.QuantizedShapeError, match="steps of 8 tokens"):
        qgemv.int8_gemm(rows, cols, 12)


def test_the_int8_kernel_refuses_what_it_cannot_read():
    with pytest.raises(qgemv.QuantizedShapeError, match="steps of 2 rows"):
        qgemv.int8_gemv(9, 64, rows_together=2)
    with pytest.raises(qgemv.QuantizedShapeError, match="groups of 64"):
        qgemv.int8_gemv(8, 96)
    with pytest.raises(qgemv.CourseError, match="VNNI or AVX2"):
        qgemv.int8_gemv(8, 64, instruction="generic")
    with pytest.raises(qgemv.QuantizedShapeError, match="groups of 16"):
        qgemv.int8_arguments(qgemv.quantize(np.ones((4, 64), np.float32), 16), qgemv.quantize_activation(np.ones(64)))
