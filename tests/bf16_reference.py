"""What a bf16 product should give, shared by the bf16 and AMX tests: the float64 product of the values rounded to
bfloat16 (the products of bf16 values are exact in float32; only the order of the sums may differ)."""

import numpy as np
import tvm

from helpers import bf16


def exact_product(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w.T`` in float64 on the bf16 values of ``a`` and ``w``."""
    rounded = [bf16.from_bits(bf16.to_bits(x.astype(np.float32))).astype(np.float64) for x in (a, w)]
    return rounded[0] @ rounded[1].T


def matmul_error(main, m: int, n: int, k: int, seed: int) -> float:
    """The relative error of a compiled bf16 matmul ``main(A bits, W packed, C)`` on seeded normal inputs against
    ``exact_product`` (``C`` starts as NaN: an output left unwritten shows)."""
    rng = np.random.default_rng(seed)
    a, w = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(n, k)).astype(np.float32)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float32), dev)
    main(tvm.runtime.tensor(bf16.to_bits(a), dev), tvm.runtime.tensor(bf16.pack_weight(bf16.to_bits(w)), dev), out)
    want = exact_product(a, w)
    return float(np.abs(out.numpy() - want).max() / np.abs(want).max())
