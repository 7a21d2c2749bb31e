"""bfloat16 kernels in TVM against float32 and against PyTorch's own bf16 (``python -m helpers.maintainers.benchmark
bf16``): the first step of a bf16 build on CPUs with AVX-512 BF16 (issue 50).

For each matrix product ``[m, k] x [k, n]`` (pointwise convolutions' and a GPT-2-small layer's),
MetaSchedule tunes the product twice with the same budget, in bf16 around ``bf16.BF16_INTRIN`` (``vdpbf16ps``,
``bf16.bf16_space``) and in float32 with LLVM's default space, and times both beside PyTorch's ``matmul``
in float32 and in bfloat16 (oneDNN's kernels), in one run. On a CPU with AMX (``amx.has_amx``) the product on
AMX tiles (``amx.matmul_amx``, written by hand, not tuned) joins them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence

import numpy as np
import torch
import tvm
from tvm import relax, te
from tvm.s_tir import meta_schedule as ms

from .. import amx, bf16, kernels, machine, timing, tuning
from .report import UNRELIABLE_MARK, load_average, print_and_keep, records, require_bf16

SHAPES = ((196, 256, 512), (3136, 144, 24), (64, 3072, 768))  # (m, n, k): 14x14 pixels, 512 to 256 channels; MobileNetV2's 56x56 expansion; GPT-2 small's MLP over 64 tokens
ENGINES = ("TVM float32 tuned", "TVM bf16 tuned", "PyTorch float32", "PyTorch bf16")
AMX_ENGINE = "TVM bf16 on AMX tiles"


def matmul_f32(m: int, n: int, k: int) -> tvm.IRModule:
    """``C[m, n] = sum_k A[m, k] * W[n, k]`` in float32, the product ``matmul_bf16`` computes in bf16."""
    A, W = te.placeholder((m, k), "float32", name="A"), te.placeholder((n, k), "float32", name="W")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * W[j, r], axis=r), name="C")
    return tvm.IRModule({"main": te.create_prim_func([A, W, C]).with_attr("global_symbol", "main")})


def relax_call(mod: tvm.IRModule, types: Sequence[tuple[tuple[int, ...], str]]) -> tvm.IRModule:
    """A Relax ``main(A, W)`` that calls ``mod``'s kernel (its arguments' shapes and dtypes ``types``, the output
    last) and returns the product: what ``tuning.tune`` takes its kernels from."""
    args = [relax.Var(name, relax.TensorType(shape, dtype)) for name, (shape, dtype) in zip("AW", types[:2])]
    bb = relax.BlockBuilder()
    with bb.function("main", args):
        product = bb.add_func(mod["main"].without_attr("global_symbol"), "product")
        bb.emit_func_output(bb.emit(relax.call_tir(product, args, relax.TensorType(*types[2]))))
    return bb.get()


def tune_kernel(mod: tvm.IRModule, types: Sequence[tuple[tuple[int, ...], str]], space, trials: int,
                target: tvm.target.Target) -> tvm.runtime.Executable:
    """One kernel tuned the course's way (``tuning.tune`` on ``relax_call``, ``trials`` candidates in ``space``)
    and built with its best schedule (``tuning.build_tuned``)."""
    wrapped = relax_call(mod, types)
    with tempfile.TemporaryDirectory() as work_dir:
        tuning.tune(wrapped, target, work_dir, trials, progress=False, space_for=lambda _task: space)
        return tuning.build_tuned(wrapped, target, work_dir)


def kernel_runners(m: int, n: int, k: int, trials: int, target: tvm.target.Target,
                   tune: Callable = tune_kernel) -> tuple[dict[str, Callable[[], object]], dict[str, float]]:
    """The four engines on one product, as runners, and the relative error of each against float64."""
    rng = np.random.default_rng(m + n + k)
    a, w = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(n, k)).astype(np.float32)
    device = tvm.cpu()
    f32_args = [tvm.runtime.tensor(x, device) for x in (a, w)]
    bf16_args = [tvm.runtime.tensor(x, device) for x in (bf16.to_bits(a), bf16.pack_weight(bf16.to_bits(w)))]
    out = ((m, n), "float32")
    f32_types = [((m, k), "float32"), ((n, k), "float32"), out]
    bf16_types = [((m, k), "uint16"), ((n // bf16.LANES, k // bf16.PAIR, bf16.LANES, bf16.PAIR), "uint16"), out]
    llvm_space = ms.space_generator.PostOrderApply(sch_rules="llvm", postprocs="llvm", mutator_probs="llvm")
    f32_kernel = relax.VirtualMachine(tune(matmul_f32(m, n, k), f32_types, llvm_space, trials, target), device)["main"]
    bf16_kernel = relax.VirtualMachine(tune(bf16.matmul_bf16(m, n, k), bf16_types, bf16.bf16_space(), trials, target),
                                       device)["main"]
    ta, tw = torch.from_numpy(a), torch.from_numpy(w)
    tab, twb = ta.bfloat16(), tw.bfloat16()

    def tvm_call(kernel, args):
        def run():
            out = kernel(*args)
            device.sync()
            return out
        return run

    runners = {ENGINES[0]: tvm_call(f32_kernel, f32_args), ENGINES[1]: tvm_call(bf16_kernel, bf16_args),
               ENGINES[2]: lambda: torch.matmul(ta, tw.T), ENGINES[3]: lambda: torch.matmul(tab, twb.T)}
    if amx.has_amx(target) and m >= amx.BLOCK_ROWS:  # (its one shape of task: 32 rows)
        amx.request_tiles()
        tiles = tvm.compile(amx.matmul_amx(m, n, k), target=target)["main"]
        amx_args = bf16_args + [tvm.runtime.tensor(np.zeros((m, n), np.float32), device)]

        def run_amx():
            tiles(*amx_args)
            return amx_args[2]
        runners[AMX_ENGINE] = run_amx
    want = a.astype(np.float64) @ w.astype(np.float64).T
    errors = {}
    for label, run in runners.items():
        out = run()
        got = out.numpy() if hasattr(out, "numpy") and not isinstance(out, torch.Tensor) else out.float().numpy()
        errors[label] = float(np.abs(got - want).max() / np.abs(want).max())
    return runners, errors


def bf16_run(shapes: Sequence[tuple[int, int, int]] = SHAPES, trials: int = 64, repeats: int = 30,
             tune: Callable = tune_kernel) -> dict:
    """Each product by the four engines, timed in alternating blocks, with GFLOP/s and errors."""
    target = machine.cpu_target()
    require_bf16(target)
    rows, load = [], load_average()
    for m, n, k in shapes:
        runners, errors = kernel_runners(m, n, k, trials, target, tune)
        timings = timing.measure_engines(runners, warmup=3, repeats=repeats)
        rows.append({"m": m, "n": n, "k": k, "engines": records(timings), "errors": errors,
                     "gflops": {t.label: 2 * m * n * k / t.median_ms / 1e6 for t in timings}})
    return {"rows": rows, "trials": trials, "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()},
            "load_average": [load, load_average()]}


def format_bf16(result: dict, machine_summary: str) -> str:
    """The kernels as Markdown: median ms (IQR), GFLOP/s and error per engine and product."""
    lines = [f"Machine: {machine_summary}", "", "| product (m x k . k x n) | engine | median ms (IQR) | GFLOP/s | "
             "vs PyTorch bf16 | max error / max |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for row in result["rows"]:
        shape, bf16_ms = f"{row['m']} x {row['k']} . {row['k']} x {row['n']}", row["engines"]["PyTorch bf16"]["median_ms"]
        for label, r in row["engines"].items():
            mark = UNRELIABLE_MARK if timing.unreliable(r) or timing.unreliable(row["engines"]["PyTorch bf16"]) else ""
            lines.append(f"| {shape} | {label} | {mark}{r['median_ms']:.4f} ({r['iqr_ms']:.4f}) | {row['gflops'][label]:.0f} | "
                         f"{mark}{bf16_ms / r['median_ms']:.2f}x | {row['errors'][label]:.1e} |")
    lines += ["", f"Each product tuned by MetaSchedule with {result['trials']} trials in float32 (LLVM's space) and in bf16 "
              "(bf16.bf16_space: tiles around vdpbf16ps); PyTorch's torch.matmul in float32 and on bfloat16 tensors. "
              + (f"{AMX_ENGINE}: amx.matmul_amx, written by hand (two 16 x 16 tiles of sums kept across the reduction), "
                 "not tuned. " if any(AMX_ENGINE in row["engines"] for row in result["rows"]) else "")
              + "Errors against float64 on the float32 inputs (bf16 rounds the inputs: about 1e-3). "
              f"{UNRELIABLE_MARK.strip()} marks a timing whose spread is over a quarter of its median: noise, not a result."]
    return "\n".join(lines)


def run_bf16(trials: int = 64, repeats: int = 30, save: bool = True) -> str:
    """The bf16 kernels, printed and kept in results/bf16-<cpu>-<cores>cores.{json,md}."""
    return print_and_keep("bf16", "bf16 kernels against float32 and PyTorch", bf16_run(trials=trials, repeats=repeats),
                          format_bf16, save)
