"""SmolLM2's decoding step compiled by TVM: one token in, the next token out, the key-value cache updated in place.

The step is a Relax function (``step_module``) of hand-written TIR kernels, each of which a learner can read
alone: the embedding row of the token (8-bit groups), then per layer a residual add fused with the RMS norm and
the int8 quantization of its output, the query, key and value rows as one 4-bit product (``qgemv.int8_gemv``),
rotary positions with the new key and value written into the cache, attention over the cache, the output
projection, the MLP's gate and up rows as one product, SiLU(gate) x up quantized, the down projection; at the
end the output norm, the tied embedding as the output layer (8-bit codes times the int8 vector) and the greedy
choice, so that only the chosen token's id comes back to Python.

A prompt's tokens are all known at once: the module's ``prefill`` function is the same chain of kernels for 16
tokens a call, its products matrix-matrix (``qgemv.int8_gemm``), each weight read once for all of them.

The weights stay as the GGUF file stores them (Q4_1 and Q8_0 groups); only the layers' matrices are stacked
([layer, rows, ...]) so that one kernel serves every layer, told which by an integer argument. GGUF orders the
rows of each query and key head for llama.cpp's rotation of adjacent pairs (``2i``, ``2i + 1``), and so does
``rope_and_cache``.

Introduced on Day 15.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.script import tirx as T

from . import int8, llm, machine, qgemv
from .errors import CourseError

GROUP = qgemv.GGUF_GROUP
MAX_CONTEXT = 512


@dataclass(frozen=True)
class Stacked:
    """One kind of 4-bit matrix of every layer, stacked: codes [L, rows, cols/2], scale and minimum [L, rows, G]."""

    codes: np.ndarray
    scale: np.ndarray
    minimum: np.ndarray

    @classmethod
    def of(cls, per_layer: list[qgemv.Q4Matrix]) -> Stacked:
        return cls(*(np.stack([getattr(m, part) for m in per_layer]) for part in ("codes", "scale", "minimum")))

    @property
    def rows(self) -> int:
        return self.codes.shape[1]

    @property
    def cols(self) -> int:
        return self.codes.shape[2] * 2

    def arrays(self) -> list[np.ndarray]:
        return [self.codes, self.scale, self.minimum]


@dataclass(frozen=True)
class Weights:
    """What the step reads: the stacked 4-bit matrices, the norms, the 8-bit embedding and the rotation tables."""

    shape: llm.LlamaShape
    qkv: Stacked
    out: Stacked
    gate_up: Stacked
    down: Stacked
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    final_norm: np.ndarray
    embed_codes: np.ndarray
    embed_scale: np.ndarray
    cos: np.ndarray
    sin: np.ndarray

    def arrays(self) -> list[np.ndarray]:
        """In the order ``step_module``'s function takes them after the token, position and caches."""
        return [*self.qkv.arrays(), *self.out.arrays(), *self.gate_up.arrays(), *self.down.arrays(), self.attn_norm,
                self.ffn_norm, self.final_norm, self.embed_codes, self.embed_scale, self.cos, self.sin]

    @property
    def nbytes(self) -> int:
        """The bytes one step reads of them (the rotation tables' one row aside)."""
        return sum(a.nbytes for a in self.arrays()[:-2])


def q8_0(raw: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF's Q8_0 blocks (a float16 scale, then 32 int8 codes) split into codes [rows, cols] and scales."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(raw.shape[0], cols // GROUP, 2 + GROUP)
    scale = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    codes = blocks[..., 2:].copy().view(np.int8).reshape(raw.shape[0], cols)
    return codes, scale


def rope_tables(head_dim: int, base: float, positions: int = MAX_CONTEXT) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of each position's angle for each pair of a head: angle = position x base^(-2i / head_dim)."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def load_weights(path=None) -> Weights:
    """The GGUF file's weights in the step's layout (the 4-bit codes are not changed, only stacked)."""
    shape = llm.shape(path)
    tensors = {t.name: t for t in llm.reader(path).tensors}

    def q4(name: str) -> qgemv.Q4Matrix:
        return llm.q4_matrix(name, path)

    def rows(*names: str) -> qgemv.Q4Matrix:
        parts = [q4(n) for n in names]
        return qgemv.Q4Matrix(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("codes", "scale", "minimum")),
                              group=GROUP)

    layers = range(shape.layers)
    embed = tensors["token_embd.weight"]
    codes, scale = q8_0(np.asarray(embed.data), shape.width)
    cos, sin = rope_tables(shape.head_dim, llm.rope_base(path))
    norm = lambda name: np.asarray(tensors[name].data, dtype=np.float32)  # noqa: E731
    return Weights(
        shape=shape,
        qkv=Stacked.of([rows(f"blk.{i}.attn_q.weight", f"blk.{i}.attn_k.weight", f"blk.{i}.attn_v.weight") for i in layers]),
        out=Stacked.of([q4(f"blk.{i}.attn_output.weight") for i in layers]),
        gate_up=Stacked.of([rows(f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight") for i in layers]),
        down=Stacked.of([q4(f"blk.{i}.ffn_down.weight") for i in layers]),
        attn_norm=np.stack([norm(f"blk.{i}.attn_norm.weight") for i in layers]),
        ffn_norm=np.stack([norm(f"blk.{i}.ffn_norm.weight") for i in layers]),
        final_norm=norm("output_norm.weight")[None, :],
        embed_codes=codes, embed_scale=scale, cos=cos, sin=sin,
    )


# ---- the kernels -------------------------------------------------------------------------------------------------

def embed_kernel(vocab: int, width: int, tokens: int = 1):
    """The token's row of the 8-bit embedding, dequantized: h = codes[token] x scale[token, group] (``tokens``
    tokens: their rows one after another)."""

    @T.prim_func
    def embed(token: T.Buffer((tokens,), "int32"), codes: T.Buffer((vocab, width), "int8"),
              scale: T.Buffer((vocab, width // GROUP), "float16"), h: T.Buffer((tokens * width,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for t, i in T.grid(tokens, width):
            h[t * width + i] = T.Cast("float32", codes[token[t], i]) * T.Cast("float32", scale[token[t], i // GROUP])

    return embed


def _int8_slot(i, paired: bool):
    """Where value ``i`` of a vector goes in ``quantize_activation``'s layout ([pair, half, 32]), as a flat index;
    ``paired=False``: the natural order, group after group."""
    if not paired:
        return i
    g, j = i // GROUP, i % GROUP
    half = GROUP // 2
    return (g // 2) * 2 * GROUP + (j // half) * GROUP + (g % 2) * half + j % half


def _scale_slot(g, spread: bool):
    """Where group ``g``'s scale goes: ``g``, or with ``spread`` the first of its copies, laid out for
    ``qgemv.int8_gemm`` (for each pair of groups, the first's scale four times, then the second's)."""
    return g * qgemv.SCALE_COPIES if spread else g


def _scale_count(groups: int, tokens: int) -> int:
    """The scales a quantized activation holds: one a group, four copies (``_scale_slot``) for a prompt's tokens."""
    return tokens * groups * (qgemv.SCALE_COPIES if tokens > 1 else 1)


@T.macro
def _quantize_groups(x, xq, xscale, xsum, groups, paired, prompt):
    """x in int8 groups of 32: scale = the group's largest magnitude / 127, codes rounded, each group's sum. For a
    ``prompt``'s tokens, the groups spread over the cores and each scale written four times (``_scale_slot``);
    one token's few groups are quicker on one core."""
    for g in T.parallel(groups) if prompt else T.serial(groups):
        largest = T.decl_buffer((1,), "float32")
        total = T.decl_buffer((1,), "int32")
        largest[0] = T.float32(0)
        total[0] = 0
        for j in range(GROUP):
            largest[0] = T.max(largest[0], T.abs(x[g * GROUP + j]))
        xscale[_scale_slot(g, prompt)] = T.Select(largest[0] > T.float32(0), largest[0] / T.float32(127), T.float32(1))
        for j in range(GROUP):
            xq[_int8_slot(g * GROUP + j, paired)] = T.Cast("int8", T.round(x[g * GROUP + j] / xscale[_scale_slot(g, prompt)]))
            total[0] = total[0] + T.Cast("int32", T.round(x[g * GROUP + j] / xscale[_scale_slot(g, prompt)]))
        xsum[g] = T.Cast("float32", total[0]) * xscale[_scale_slot(g, prompt)]
        if prompt:
            for k in range(1, qgemv.SCALE_COPIES):
                xscale[_scale_slot(g, prompt) + k] = xscale[_scale_slot(g, prompt)]


def add_norm_quantize_kernel(width: int, layers: int, eps: float, paired: bool = True, tokens: int = 1):
    """h_out = h + delta; x = RMS-normalized h_out times the layer's norm weights; x quantized to int8 in groups of
    32 (``qgemv.quantize_activation``'s layout, or the natural order with ``paired=False``); each of ``tokens``
    vectors (one after another) alone."""
    groups = width // GROUP

    @T.prim_func
    def add_norm_quantize(h: T.Buffer((tokens * width,), "float32"), delta: T.Buffer((tokens * width,), "float32"),
                          weight: T.Buffer((layers, width), "float32"), layer: T.int32,
                          h_out: T.Buffer((tokens * width,), "float32"), xq: T.Buffer((tokens * width,), "int8"),
                          xscale: T.Buffer((_scale_count(groups, tokens),), "float32"),
                          xsum: T.Buffer((tokens * groups,), "float32"), x: T.Buffer((tokens * width,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for t in T.parallel(tokens) if tokens > 1 else T.serial(tokens):
            squares = T.decl_buffer((1,), "float32")
            squares[0] = T.float32(0)
            for i in range(width):
                h_out[t * width + i] = h[t * width + i] + delta[t * width + i]
                squares[0] = squares[0] + h_out[t * width + i] * h_out[t * width + i]
            for i in range(width):
                x[t * width + i] = h_out[t * width + i] / T.sqrt(
                    squares[0] / T.float32(width) + T.float32(eps)) * weight[layer, i]
        # a token's groups come in pairs (width is a multiple of 64): the tokens quantize as one long vector
        _quantize_groups(x, xq, xscale, xsum, tokens * groups, paired, tokens > 1)

    return add_norm_quantize


def quantize_kernel(width: int, tokens: int = 1):
    """A vector quantized to int8 as ``qgemv.quantize_activation`` does (the attention's output, before the
    output projection); ``tokens`` vectors one after another."""
    groups = width // GROUP

    @T.prim_func
    def quantize(x: T.Buffer((tokens * width,), "float32"), xq: T.Buffer((tokens * width,), "int8"),
                 xscale: T.Buffer((_scale_count(groups, tokens),), "float32"), xsum: T.Buffer((tokens * groups,), "float32")):
        T.func_attr({"tirx.noalias": True})
        _quantize_groups(x, xq, xscale, xsum, tokens * groups, True, tokens > 1)

    return quantize


def rope_and_cache_kernel(shape: llm.LlamaShape, context: int = MAX_CONTEXT, tokens: int = 1):
    """Rotate the query and the new key by the position's angles (adjacent pairs, as GGUF orders the rows), and
    write the key and value into the layer's cache at ``pos`` (in place); ``tokens`` tokens at ``pos`` onwards."""
    H, KV, hd, L = shape.heads, shape.kv_heads, shape.head_dim, shape.layers
    q_rows, kv_rows = H * hd, KV * hd
    rows = q_rows + 2 * kv_rows

    @T.prim_func
    def rope_and_cache(qkv: T.Buffer((tokens * rows,), "float32"), pos: T.Buffer((1,), "int32"),
                       cos: T.Buffer((context, hd // 2), "float32"), sin: T.Buffer((context, hd // 2), "float32"),
                       k_cache: T.Buffer((L, KV, context, hd), "float32"),
                       v_cache: T.Buffer((L, KV, context, hd), "float32"), layer: T.int32,
                       q: T.Buffer((tokens * q_rows,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for t in range(tokens):
            p = pos[0] + t
            for head in range(H):
                for i in range(hd // 2):
                    a = qkv[t * rows + head * hd + 2 * i]
                    b = qkv[t * rows + head * hd + 2 * i + 1]
                    q[t * q_rows + head * hd + 2 * i] = a * cos[p, i] - b * sin[p, i]
                    q[t * q_rows + head * hd + 2 * i + 1] = a * sin[p, i] + b * cos[p, i]
            for head in range(KV):
                for i in range(hd // 2):
                    a = qkv[t * rows + q_rows + head * hd + 2 * i]
                    b = qkv[t * rows + q_rows + head * hd + 2 * i + 1]
                    k_cache[layer, head, p, 2 * i] = a * cos[p, i] - b * sin[p, i]
                    k_cache[layer, head, p, 2 * i + 1] = a * sin[p, i] + b * cos[p, i]
                for i in range(hd):
                    v_cache[layer, head, p, i] = qkv[t * rows + q_rows + kv_rows + head * hd + i]

    return rope_and_cache


def attention_kernel(shape: llm.LlamaShape, context: int = MAX_CONTEXT, tokens: int = 1):
    """Each query head against the cache of its key-value head (grouped-query attention), positions 0..pos: scores
    scaled by 1/sqrt(head_dim), softmax, the values weighted; heads spread over the cores. With ``tokens``
    queries (a prompt's, one after another), the one at ``pos + t`` reads positions 0..pos + t: causal."""
    H, KV, hd, L = shape.heads, shape.kv_heads, shape.head_dim, shape.layers
    per_kv = H // KV
    scale = float(1.0 / np.sqrt(hd))
    if hd % 8:
        raise CourseError(f"the attention kernel reads 8 or 16 lanes of a head at a time; this model's heads have "
                          f"{hd} values, not a multiple of 8 (Llama models have 64 or 128)")
    LANES = 16 if hd % 16 == 0 else 8

    # Written out where used, never bound to a name inside the parallel loop: TVM 0.27 gives every such name a
    # workspace allocation (heap memory) on each iteration, as its compiled code shows
    def kv_of(query):
        return query % H // per_kv   # the key-value head a query head reads (grouped-query attention)

    def seen(pos, query):
        return pos[0] + query // H + 1   # the positions a query sees: the token's own and those before it

    @T.prim_func
    def attention(q: T.Buffer((tokens * H * hd,), "float32"), pos: T.Buffer((1,), "int32"),
                  k_cache: T.Buffer((L, KV, context, hd), "float32"), v_cache: T.Buffer((L, KV, context, hd), "float32"),
                  layer: T.int32, out: T.Buffer((tokens * H * hd,), "float32"),
                  scores: T.Buffer((tokens * H, context), "float32")):
        T.func_attr({"tirx.noalias": True})
        for query in T.parallel(tokens * H):   # each token's heads, spread over the cores; q[query * hd:] is its own
            top = T.decl_buffer((2,), "float32")
            lanes = T.decl_buffer((LANES,), "float32", scope="global")   # registers (see qgemv.int8_gemv)
            sums = T.decl_buffer((hd,), "float32", scope="global")
            top[0] = T.float32(-3.0e38)
            for t in range(seen(pos, query)):
                # q . k in LANES partial sums, added up at the end: one long chain of dependent additions
                # would wait for each one (the loop over the past is most of this kernel's time)
                lanes[T.ramp(0, 1, LANES)] = T.broadcast(T.float32(0), LANES)
                for i in range(hd // LANES):
                    lanes[T.ramp(0, 1, LANES)] = lanes[T.ramp(0, 1, LANES)] + q.vload(
                        [query * hd + i * LANES], f"float32x{LANES}") * k_cache.vload([layer, kv_of(query), t, i * LANES],
                                                                               f"float32x{LANES}")
                scores[query, t] = T.float32(0)
                for j in T.unroll(LANES):
                    scores[query, t] = scores[query, t] + lanes[j]
                scores[query, t] = scores[query, t] * T.float32(scale)
                top[0] = T.max(top[0], scores[query, t])
            top[1] = T.float32(0)
            for t in range(seen(pos, query)):
                scores[query, t] = T.exp(scores[query, t] - top[0])
                top[1] = top[1] + scores[query, t]
            # the values weighted, a head's sums in registers (hd floats: 256 bytes at 64), divided once at the end
            for i in range(hd // LANES):
                sums[T.ramp(i * LANES, 1, LANES)] = T.broadcast(T.float32(0), LANES)
            for t in range(seen(pos, query)):
                for i in range(hd // LANES):
                    sums[T.ramp(i * LANES, 1, LANES)] = sums[T.ramp(i * LANES, 1, LANES)] + T.broadcast(
                        scores[query, t], LANES) * v_cache.vload([layer, kv_of(query), t, i * LANES], f"float32x{LANES}")
            for i in range(hd // LANES):
                out[T.ramp(query * hd + i * LANES, 1, LANES)] = sums[T.ramp(i * LANES, 1, LANES)] / T.broadcast(top[1], LANES)

    return attention


def silu_mul_quantize_kernel(mlp: int, tokens: int = 1):
    """x = SiLU(gate) x up (the gate and up rows come as one vector), quantized as ``quantize_kernel``; ``tokens``
    vectors one after another."""
    groups = mlp // GROUP

    @T.prim_func
    def silu_mul_quantize(gate_up: T.Buffer((tokens * 2 * mlp,), "float32"), xq: T.Buffer((tokens * mlp,), "int8"),
                          xscale: T.Buffer((_scale_count(groups, tokens),), "float32"),
                          xsum: T.Buffer((tokens * groups,), "float32"), x: T.Buffer((tokens * mlp,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for t in T.parallel(tokens) if tokens > 1 else T.serial(tokens):
            for i in range(mlp):
                x[t * mlp + i] = gate_up[2 * t * mlp + i] / (T.float32(1) + T.exp(-gate_up[2 * t * mlp + i])) * \
                    gate_up[2 * t * mlp + mlp + i]
        _quantize_groups(x, xq, xscale, xsum, tokens * groups, True, tokens > 1)

    return silu_mul_quantize


def q8_gemv_kernel(rows: int, cols: int, instruction: str, rows_together: int = 4):
    """logits = codes x x for 8-bit codes (the tied embedding) and the int8 vector in natural order: both signed,
    so the sign of x moves onto the codes (``psign``) and |x| is the unsigned operand, as llama.cpp does.

    No software prefetch, unlike the layers' products: this one matrix (30 MB) is read in order from start to end,
    which the hardware prefetcher follows by itself, and the prefetch instructions only cost issue slots (a step
    took 0.5 ms less without them, 9.5 against 10.0 ms, interleaved on a Zen 4)."""
    groups, R = cols // GROUP, rows_together

    def products(codes, xq, n, g):
        x = xq.vload([g * GROUP], "int8x32")
        signed = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx2.psign.b"),
                                         codes.vload([n, g * GROUP], "int8x32"), x, dtype="int8x32")
        return qgemv.byte_dot(T.broadcast(T.int32(0), 8), T.reinterpret(T.abs(x), dtype="uint8x32"), signed, instruction)

    @T.prim_func
    def q8_gemv(xq: T.Buffer((cols,), "int8"), xscale: T.Buffer((groups,), "float32"),
                codes: T.Buffer((rows, cols), "int8"), scale: T.Buffer((rows, groups), "float16"),
                y: T.Buffer((rows,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for c in T.parallel(rows // R):
            lanes = T.decl_buffer((R, 8), "float32", scope="global")   # on the stack (see qgemv.int8_gemv)
            for r in T.unroll(R):
                lanes[r, T.ramp(0, 1, 8)] = T.broadcast(T.float32(0), 8)
            for g in range(groups):
                for r in T.unroll(R):
                    lanes[r, T.ramp(0, 1, 8)] = lanes[r, T.ramp(0, 1, 8)] + T.Cast(
                        "float32x8", products(codes, xq, c * R + r, g)) * T.broadcast(
                        T.Cast("float32", scale[c * R + r, g]) * xscale[g], 8)
            for r in T.unroll(R):
                y[c * R + r] = lanes[r, 0] + lanes[r, 1] + lanes[r, 2] + lanes[r, 3] + lanes[r, 4] + lanes[r, 5] + \
                    lanes[r, 6] + lanes[r, 7]

    return q8_gemv


def argmax_kernel(n: int):
    """The index of the largest value: the greedy choice, made where the logits are."""

    @T.prim_func
    def argmax(values: T.Buffer((n,), "float32"), best: T.Buffer((1,), "int32")):
        T.func_attr({"tirx.noalias": True})
        top = T.decl_buffer((1,), "float32")
        top[0] = values[0]
        best[0] = 0
        for i in range(1, n):
            if values[i] > top[0]:
                top[0] = values[i]
                best[0] = i

    return argmax


# ---- the step ----------------------------------------------------------------------------------------------------

def _index(i: int) -> relax.Expr:
    """A layer's number as a kernel's int32 argument."""
    return relax.prim_value(tvm.tirx.IntImm("int32", i))


def _tensor(shape, dtype: str) -> relax.TensorType:
    return relax.TensorType([int(d) for d in shape], dtype)


PREFILL_TOKENS = 16   # a prompt's tokens per call of ``prefill``


def step_module(weights: Weights, instruction: str | None = None, context: int = MAX_CONTEXT,
                prefetch_next: bool = True, prefill_tokens: int = PREFILL_TOKENS) -> tvm.IRModule:
    """The decoding step as a Relax module: ``main(token, pos, k_cache, v_cache, *weights.arrays())`` returns
    (next token, logits, k_cache, v_cache), the caches written in place; ``feed``, with the same arguments, only
    writes the token's keys and values into the caches (a prompt's tokens before its last need no logits: the
    output layer reads the 30 MB embedding, a fifth of a step); ``prefill`` does what ``feed`` does for
    ``prefill_tokens`` tokens at positions ``pos`` onwards, its products matrix-matrix (``qgemv.int8_gemm``: each
    weight read once for all the tokens)."""
    s, eps = weights.shape, 1e-5
    instruction = instruction or int8.int8_instruction(machine.cpu_target())
    D, F, hd = s.width, s.mlp, s.head_dim
    layers = s.layers
    bb = relax.BlockBuilder()

    def products(stacked: Stacked, tokens: int):
        if tokens == 1:
            return _stacked_gemv(stacked, instruction, prefetch_next)
        return qgemv.int8_gemm(stacked.rows, stacked.cols, tokens, instruction, layers=stacked.codes.shape[0])

    def kernels_for(tokens: int) -> dict:
        """Every kernel of a function that takes ``tokens`` tokens, added to the module (named ``_x<tokens>``
        after the first)."""
        kernels = {
            "embed": embed_kernel(s.vocab, D, tokens),
            "attn_norm": add_norm_quantize_kernel(D, layers, eps, tokens=tokens),
            "ffn_norm": add_norm_quantize_kernel(D, layers, eps, tokens=tokens),
            "quantize": quantize_kernel(D, tokens),
            "qkv": products(weights.qkv, tokens),
            "out": products(weights.out, tokens),
            "gate_up": products(weights.gate_up, tokens),
            "down": products(weights.down, tokens),
            "rope_and_cache": rope_and_cache_kernel(s, context, tokens),
            "attention": attention_kernel(s, context, tokens),
            "silu_mul_quantize": silu_mul_quantize_kernel(F, tokens),
        }
        if tokens == 1:
            kernels.update({
                "final_norm": add_norm_quantize_kernel(D, 1, eps, paired=False),
                "logits": q8_gemv_kernel(s.vocab, D, instruction, rows_together=1),
                "argmax": argmax_kernel(s.vocab),
            })
        suffix = "" if tokens == 1 else f"_x{tokens}"
        return {name: bb.add_func(func.with_attr("global_symbol", name + suffix), name + suffix)
                for name, func in kernels.items()}

    cache_shape = (layers, s.kv_heads, context, hd)
    names = ["qkv_codes", "qkv_scale", "qkv_min", "out_codes", "out_scale", "out_min", "gate_up_codes", "gate_up_scale",
             "gate_up_min", "down_codes", "down_scale", "down_min", "attn_norm", "ffn_norm", "final_norm", "embed_codes",
             "embed_scale", "cos", "sin"]

    def function(name: str, logits: bool, gv: dict, tokens: int = 1) -> None:
        """``name``: the step for ``tokens`` tokens; with ``logits``, through the output layer and the greedy
        choice, else the caches only."""
        params = [relax.Var("token", _tensor((tokens,), "int32")), relax.Var("pos", _tensor((1,), "int32")),
                  relax.Var("k_cache", _tensor(cache_shape, "float32")),
                  relax.Var("v_cache", _tensor(cache_shape, "float32"))]
        w = {n: relax.Var(n, _tensor(a.shape, str(a.dtype))) for n, a in zip(names, weights.arrays())}
        token, pos, k_cache, v_cache = params

        def quantized(width):
            return [_tensor((tokens * width,), "int8"), _tensor((_scale_count(width // GROUP, tokens),), "float32"),
                    _tensor((tokens * width // GROUP,), "float32"), _tensor((tokens * width,), "float32")]

        def gemv(kernel, x, layer, rows):
            return bb.emit(relax.call_tir(gv[kernel], [x[0], x[1], x[2], w[f"{kernel}_codes"], w[f"{kernel}_scale"],
                                                       w[f"{kernel}_min"], _index(layer)],
                                          _tensor((tokens * rows,), "float32")))

        def norm(kernel, h, delta, weight, layer):
            out = bb.emit(relax.call_tir(gv[kernel], [h, delta, weight, _index(layer)],
                                         [_tensor((tokens * D,), "float32"), *quantized(D)]))
            return [bb.emit(relax.TupleGetItem(out, i)) for i in range(4)]

        with bb.function(name, params + list(w.values())):
            with bb.dataflow():
                h = bb.emit(relax.call_tir(gv["embed"], [token, w["embed_codes"], w["embed_scale"]],
                                           _tensor((tokens * D,), "float32")))
                delta = bb.emit(relax.op.zeros((tokens * D,), "float32"))
                for layer in range(layers):
                    h, *x = norm("attn_norm", h, delta, w["attn_norm"], layer)
                    qkv = gemv("qkv", x, layer, weights.qkv.rows)
                    rotated = bb.emit(relax.op.call_tir_inplace(
                        gv["rope_and_cache"], [qkv, pos, w["cos"], w["sin"], k_cache, v_cache, _index(layer)],
                        [-1, 4, 5], [_tensor((tokens * s.heads * hd,), "float32"), _tensor(cache_shape, "float32"),
                                     _tensor(cache_shape, "float32")]))
                    q, k_cache, v_cache = (bb.emit(relax.TupleGetItem(rotated, i)) for i in range(3))
                    attended = bb.emit(relax.call_tir(gv["attention"], [q, pos, k_cache, v_cache, _index(layer)],
                                                      [_tensor((tokens * s.heads * hd,), "float32"),
                                                       _tensor((tokens * s.heads, context), "float32")]))
                    a = bb.emit(relax.call_tir(gv["quantize"], [bb.emit(relax.TupleGetItem(attended, 0))],
                                               quantized(D)[:3]))
                    delta = gemv("out", [bb.emit(relax.TupleGetItem(a, i)) for i in range(3)], layer, D)
                    h, *x = norm("ffn_norm", h, delta, w["ffn_norm"], layer)
                    gate_up = gemv("gate_up", x, layer, weights.gate_up.rows)
                    mlp = bb.emit(relax.call_tir(gv["silu_mul_quantize"], [gate_up], quantized(F)))
                    delta = gemv("down", [bb.emit(relax.TupleGetItem(mlp, i)) for i in range(3)], layer, D)
                if logits:
                    h, *x = norm("final_norm", h, delta, w["final_norm"], 0)
                    scores = bb.emit(relax.call_tir(gv["logits"], [x[0], x[1], w["embed_codes"], w["embed_scale"]],
                                                    _tensor((s.vocab,), "float32")))
                    best = bb.emit(relax.call_tir(gv["argmax"], [scores], _tensor((1,), "int32")))
                    result = bb.emit_output(relax.Tuple([best, scores, k_cache, v_cache]))
                else:
                    result = bb.emit_output(relax.Tuple([k_cache, v_cache]))
            bb.emit_func_output(result)

    one = kernels_for(1)
    function("main", logits=True, gv=one)
    function("feed", logits=False, gv=one)
    if prefill_tokens > 1:
        function("prefill", logits=False, gv=kernels_for(prefill_tokens), tokens=prefill_tokens)
    return bb.get()


def _stacked_gemv(stacked: Stacked, instruction: str, prefetch_next: bool):
    """``qgemv.int8_gemv`` over a stacked matrix, the layer an argument."""
    return qgemv.int8_gemv(stacked.rows, stacked.cols, instruction, layers=stacked.codes.shape[0],
                           prefetch_next=prefetch_next)


def build_pipeline() -> tvm.transform.Pass:
    """TVM's default Relax build passes but one: ``RewriteDataflowReshape`` reads every kernel as a block-style
    (``s_tir``) function and stops at the step's loop-by-loop kernels; none of them reshapes anything."""
    from tvm.relax import backend, transform

    return tvm.transform.Sequential([
        backend.DispatchSampling(), backend.DispatchSortScan(), transform.LegalizeOps(), transform.ToNonDataflow(),
        transform.RemovePurityChecking(), transform.CallTIRRewrite(), transform.StaticPlanBlockMemory(),
        transform.LowerAllocTensor(), transform.KillAfterLastUse(), transform.LowerRuntimeBuiltin(),
        transform.ComputePrimValue(), transform.VMShapeLower(), transform.AttachGlobalSymbol(),
    ])


class Decoder:
    """The compiled step with its weights and caches on the device: ``feed`` a prompt, ``generate`` greedily."""

    def __init__(self, weights: Weights, instruction: str | None = None, context: int = MAX_CONTEXT,
                 target: tvm.target.Target | None = None, prefetch_next: bool = True,
                 prefill_tokens: int = PREFILL_TOKENS) -> None:
        if not 0 < context <= weights.cos.shape[0]:
            raise CourseError(f"context must be 1 to {weights.cos.shape[0]} positions (the rotation tables' length); "
                              f"got {context}")
        weights = dataclasses.replace(weights, cos=weights.cos[:context], sin=weights.sin[:context])
        self.weights, self.context = weights, context
        self.device = tvm.cpu()
        target = target or machine.cpu_target()
        if prefill_tokens < 2 or (prefill_tokens > 8 and prefill_tokens % 8):
            raise CourseError(f"prefill_tokens must be 2 to 8, or a multiple of 8 (the products take up to 8 "
                              f"tokens at a time); got {prefill_tokens}")
        self.executable = tvm.compile(step_module(weights, instruction, context, prefetch_next, prefill_tokens),
                                      target=target, relax_pipeline=build_pipeline())
        self.vm = relax.VirtualMachine(self.executable, self.device)
        self.step_fn, self.feed_fn, self.prefill_fn = self.vm["main"], self.vm["feed"], self.vm["prefill"]
        self.prefill_tokens = prefill_tokens
        self.params = [tvm.runtime.tensor(a, self.device) for a in weights.arrays()]
        cache = (weights.shape.layers, weights.shape.kv_heads, context, weights.shape.head_dim)
        self.k_cache = tvm.runtime.tensor(np.zeros(cache, np.float32), self.device)
        self.v_cache = tvm.runtime.tensor(np.zeros(cache, np.float32), self.device)
        self.length = 0

    def step(self, token, logits: bool = True) -> tuple | None:
        """One token at the next position: (the greedy next token, the logits), both still on the device; with
        ``logits=False``, only its keys and values into the cache (``feed``'s function: no output layer)."""
        if self.length >= self.context:
            raise CourseError(f"the cache holds {self.context} positions; start again with reset() or a larger context")
        token = token if isinstance(token, tvm.runtime.Tensor) else tvm.runtime.tensor(np.array([token], np.int32))
        pos = tvm.runtime.tensor(np.array([self.length], np.int32), self.device)
        out = (self.step_fn if logits else self.feed_fn)(token, pos, self.k_cache, self.v_cache, *self.params)
        self.length += 1
        return (out[0], out[1]) if logits else None

    def reset(self) -> None:
        self.length = 0

    def prefill(self, ids) -> None:
        """Up to ``prefill_tokens`` tokens' keys and values into the cache in one call. Fewer are padded with
        token 0: the padding's keys land at positions after the prompt, which no query reads before the next
        tokens write over them (a query at position p reads positions 0..p only)."""
        ids = [int(token) for token in ids]
        if not 0 < len(ids) <= self.prefill_tokens:
            raise CourseError(f"prefill() takes 1 to {self.prefill_tokens} tokens; got {len(ids)}")
        if self.length + self.prefill_tokens > self.context:
            raise CourseError(f"the cache holds {self.context} positions, and a prefill writes {self.prefill_tokens} "
                              f"from position {self.length}; feed the rest one token at a time (step)")
        tokens = tvm.runtime.tensor(np.array(ids + [0] * (self.prefill_tokens - len(ids)), np.int32), self.device)
        pos = tvm.runtime.tensor(np.array([self.length], np.int32), self.device)
        self.prefill_fn(tokens, pos, self.k_cache, self.v_cache, *self.params)
        self.length += len(ids)

    def feed(self, ids, prefill: bool = True) -> tuple:
        """The prompt into the cache, ``prefill_tokens`` tokens a call (the last ones one at a time where a whole
        call would run past the cache's end; all of them with ``prefill=False``), then its last token through the
        output layer: that step's outputs. Only the last token needs logits: the others' would be thrown away."""
        ids = [int(token) for token in ids]
        if not ids:
            raise CourseError("feed() needs at least one token: the prompt is empty")
        rest = ids[:-1]
        while prefill and rest and self.length + self.prefill_tokens <= self.context:
            self.prefill(rest[:self.prefill_tokens])
            rest = rest[self.prefill_tokens:]
        for token in rest:
            self.step(token, logits=False)
        return self.step(ids[-1])

    def generate(self, ids, max_new_tokens: int, stop: int | None = None) -> tuple[list[int], float]:
        """Greedy tokens after the prompt ``ids``, and the seconds they took (the prompt included)."""
        self.reset()
        start = time.perf_counter()
        best, _ = self.feed(ids)
        out = []
        for _ in range(max_new_tokens):
            token = int(best.numpy()[0])
            out.append(token)
            if token == stop:
                break
            best, _ = self.step(best)
        return out, time.perf_counter() - start

    def kernel_times(self, token: int = 1, repeats: int = 5) -> dict[str, float]:
        """Milliseconds per step in each function the VM calls (the kernels by name, the VM's own ``vm.builtin.*``
        calls added up), one step at the current position taken ``repeats`` times: the VM's instrument hook,
        timing each call. The hook's own cost (a Python call around each) inflates the total a little."""
        spent: dict[str, float] = {}
        started: list[float] = []

        def hook(func, name, before_run, ret_value, *args):
            if before_run:
                started.append(time.perf_counter())
            else:
                key = "VM's own calls (allocations, tuples)" if name.startswith("vm.builtin.") else name
                spent[key] = spent.get(key, 0.0) + (time.perf_counter() - started.pop()) * 1e3 / repeats
            return 0

        length = self.length
        token_in = tvm.runtime.tensor(np.array([token], np.int32))
        pos = tvm.runtime.tensor(np.array([length], np.int32), self.device)
        self.vm.set_instrument(hook)
        try:
            for _ in range(repeats):
                self.step_fn(token_in, pos, self.k_cache, self.v_cache, *self.params)
        finally:
            self.vm.set_instrument(None)
        return dict(sorted(spent.items(), key=lambda kv: -kv[1]))
