"""TVM's own KV cache (Day 14): the course's small GPT over ``TIRPagedKVCache``, built for the CPU.

The explicit cache of ``helpers.transformer`` is two tensors that each decoding step takes and gives
back one position longer, so every step copies the whole past into new tensors. The cache MLC LLM
uses, shipped in TVM's wheel, is a runtime **object**: it keeps keys and values in fixed-size pages,
appends a step's keys and values in place, and can hold many sequences at once. A model reaches it
through ``PagedKVCache.attention_with_fused_qkv``, one ``call_dps_packed`` into the runtime, which
runs the attention kernels the cache was created with (on ``llvm``, TIR loops written for the CPU).

torch.export cannot thread a runtime object through a PyTorch model, so the model is written again
with ``relax.frontend.nn``, TVM's own PyTorch-like modules, with the same layers and parameter names
as ``transformer.TinyGPT``: the PyTorch model's weights load as they are, and the two are checked
against each other.

Introduced on Day 14.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, TIRPagedKVCache
from tvm.runtime import ShapeTuple

from . import tuning
from .build import build_runnable, device_for
from .databases import Database
from .errors import CourseError, InputShapeError
from .machine import cpu_target
from .transformer import DecodeStep, GPTConfig, PrefillStep, TinyGPT

PAGE_SIZE = 16  # tokens per page
SEQUENCE = 0  # the one sequence the course's cache holds
ROPE_NONE = 0  # RopeMode.NONE: TinyGPT learns its positions (GPT-2), the cache rotates nothing
PAGED_TOKEN_DTYPE = "int32"  # what nn.Embedding's lookup takes here
LABEL = "TVM decode, paged cache"  # its decoding step, in tables beside transformer's
TUNED_LABEL = "TVM decode, paged cache, static kernels tuned"
DATABASE_NAME = "tinygpt_paged"  # the tuning database of its static kernels (the decoding step's matmuls)


class PagedBlock(nn.Module):
    """``transformer.Block`` in ``relax.frontend.nn``, its attention done by the paged cache.

    Its layers have the names of PyTorch's block, so that TinyGPT's weights load as they are; a block of
    another class (``PagedGPT``'s ``block``) must keep them."""

    def __init__(self, config: GPTConfig) -> None:
        self.heads, self.head_dim = config.heads, config.head_dim
        self.ln1, self.ln2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        self.fc, self.out = nn.Linear(config.width, 4 * config.width), nn.Linear(4 * config.width, config.width)

    def forward(self, x: nn.Tensor, cache: PagedKVCache, layer: int) -> nn.Tensor:
        batch, length, width = x.shape
        # q, k and v side by side, head by head: the fused layout the cache's attention reads
        qkv = op.reshape(self.qkv(self.ln1(x)), (batch, length, 3 * self.heads, self.head_dim))
        attended = cache.attention_with_fused_qkv(layer, qkv, self.heads, sm_scale=self.head_dim ** -0.5)
        x = x + self.proj(op.reshape(attended, (batch, length, width)))
        return x + self.out(op.gelu(self.fc(self.ln2(x))))


class PagedGPT(nn.Module):
    """``transformer.TinyGPT`` over a paged KV cache: ``prefill`` and ``decode`` take token ids, their
    positions and the cache, and return the logits and the cache (the same object, now longer).
    ``block``: the class of its blocks, called as ``block(config)``, then ``block(x, cache, layer)``."""

    def __init__(self, config: GPTConfig, target: tvm.target.Target, block: type[nn.Module] = PagedBlock) -> None:
        self.config, self.target = config, target
        self.tok, self.pos = nn.Embedding(config.vocab, config.width), nn.Embedding(config.max_len, config.width)
        self.blocks = nn.ModuleList([block(config) for _ in range(config.layers)])
        self.ln = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)

    def _forward(self, ids: nn.Tensor, positions: nn.Tensor, cache: PagedKVCache):
        x = op.reshape(self.tok(ids) + self.pos(positions), (1, ids.shape[0], self.config.width))
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        return self.head(self.ln(x)), cache

    def prefill(self, ids: nn.Tensor, positions: nn.Tensor, cache: PagedKVCache):
        return self._forward(ids, positions, cache)

    def decode(self, ids: nn.Tensor, positions: nn.Tensor, cache: PagedKVCache):
        return self._forward(ids, positions, cache)

    def create_cache(self, max_batch_size, max_total_seq_len, prefill_chunk_size, page_size) -> PagedKVCache:
        c = self.config
        return TIRPagedKVCache(
            attn_kind="mha", max_batch_size=max_batch_size, max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size, page_size=page_size, support_sliding_window=0,
            layer_partition=relax.ShapeExpr([0, c.layers]), num_hidden_layers=c.layers,
            num_attention_heads=c.heads, num_key_value_heads=c.kv_heads, qk_head_dim=c.head_dim,
            v_head_dim=c.head_dim, mla_original_qk_head_dim=0, mla_original_v_head_dim=0,
            rope_mode=ROPE_NONE, rope_scale=1, rope_theta=10000, rope_scaling={},
            rope_ext_factors=relax.prim_value(0), rotary_dim=c.head_dim, enable_disaggregation=False,
            dtype="float32", target=self.target)

    def spec(self) -> nn.spec.ModuleSpec:
        """What ``export_tvm`` builds: prefill (any length), decode (one token), and the cache's constructor."""
        weights = {"param_mode": "packed", "effect_mode": "none"}  # the weights as one tuple argument
        cache = nn.spec.Object(object_type=PagedKVCache)
        return nn.spec.ModuleSpec.from_raw({
            "prefill": {"ids": nn.spec.Tensor(["length"], PAGED_TOKEN_DTYPE), "positions": nn.spec.Tensor(["length"], PAGED_TOKEN_DTYPE),
                        "cache": cache, "$": weights},
            "decode": {"ids": nn.spec.Tensor([1], PAGED_TOKEN_DTYPE), "positions": nn.spec.Tensor([1], PAGED_TOKEN_DTYPE),
                       "cache": cache, "$": weights},
            "create_cache": {"max_batch_size": int, "max_total_seq_len": int, "prefill_chunk_size": int,
                             "page_size": int, "$": {"param_mode": "none", "effect_mode": "none"}},
        }, self)


def export(model: TinyGPT, target: tvm.target.Target | None = None,
           block: type[nn.Module] = PagedBlock) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """``model`` as a Relax module over a paged cache (its blocks of class ``block``), and its weights in
    the order the module takes them."""
    paged = PagedGPT(model.config, target or cpu_target(), block)
    mod, named = paged.export_tvm(spec=paged.spec())
    weights = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}
    missing = [name for name, _ in named if name not in weights]
    if missing:
        raise CourseError(f"The paged model needs weights the PyTorch model does not have: {missing[:3]}. "
                          "Name each layer as transformer.Block does (ln1, qkv, proj, ln2, fc, out).")
    wrong = [f"{name} {tuple(int(d) for d in p.shape)} (PyTorch's: {weights[name].shape})"
             for name, p in named if tuple(int(d) for d in p.shape) != weights[name].shape]
    if wrong:
        raise CourseError(f"Layers of the paged model have other shapes than PyTorch's: {wrong[:3]}.")
    return mod, [weights[name] for name, _ in named]


def _builtin(name: str) -> Callable:
    return tvm.get_global_func(f"vm.builtin.{name}")


@dataclass
class PagedDecoder:
    """The compiled paged model with its weights; one cache per ``new_cache()``, one sequence in it."""

    vm: relax.VirtualMachine
    params: list[tvm.runtime.Tensor]
    device: tvm.runtime.Device
    config: GPTConfig

    def new_cache(self) -> tvm.runtime.Object:
        """An empty cache for one sequence of up to ``max_len`` tokens."""
        c = self.config
        cache = self.vm["create_cache"](ShapeTuple([1]), ShapeTuple([c.max_len]), ShapeTuple([c.max_len]),
                                        ShapeTuple([PAGE_SIZE]))
        _builtin("kv_state_add_sequence")(cache, SEQUENCE)
        return cache

    def run(self, function: str, ids, start: int, cache) -> np.ndarray:
        """Tokens ``ids`` at positions ``start, start + 1, ...`` through ``function``, appended to ``cache``."""
        ids = np.asarray(ids, dtype=PAGED_TOKEN_DTYPE).reshape(-1)
        if ids.size < 1 or start + ids.size > self.config.max_len:
            raise InputShapeError(f"The cache holds {self.config.max_len} positions: {ids.size} token(s) from "
                                  f"position {start} do not fit.")
        positions = np.arange(start, start + ids.size, dtype=PAGED_TOKEN_DTYPE)
        _builtin("kv_state_begin_forward")(cache, ShapeTuple([SEQUENCE]), ShapeTuple([ids.size]))
        logits, _ = self.vm[function](tvm.runtime.tensor(ids, self.device), tvm.runtime.tensor(positions, self.device),
                                      cache, self.params)
        _builtin("kv_state_end_forward")(cache)
        return logits.numpy()

    def steps(self) -> tuple[PrefillStep, DecodeStep]:
        """Prefill and decode in ``transformer``'s step form; the cache they hand on is the cache object."""

        def prefill(ids):
            cache = self.new_cache()
            return self.run("prefill", ids, 0, cache), cache

        def decode(token, position, cache):
            return self.run("decode", [token], position, cache), cache

        return prefill, decode

    def cache_contents(self, cache, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values of the cache's first ``length`` positions, read back from its pages
        (``attention_kv_cache_debug_get_kv``), in ``transformer``'s layout ``(layers, 1, kv_heads, length, head_dim)``."""
        c = self.config
        keys, values = (tvm.runtime.tensor(np.zeros((c.layers, length, c.kv_heads, c.head_dim), "float32"), self.device)
                        for _ in range(2))
        _builtin("attention_kv_cache_debug_get_kv")(cache, SEQUENCE, 0, length, keys, values)
        return tuple(t.numpy().transpose(0, 2, 1, 3)[:, None] for t in (keys, values))

    def after_one_step(self, prompt, token: int, cache=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The logits, keys and values (NumPy) after one step of ``token`` following ``prompt``, on a new cache
        filled by ``prefill``: the keys and values read back from the cache's pages. (``cache``, PyTorch's keys
        and values for ``prompt``, is for the explicit decoder: this one fills its own.)"""
        cache = self.new_cache()
        self.run("prefill", prompt, 0, cache)
        past = int(np.asarray(prompt).size)
        logits = self.run("decode", [token], past, cache)
        return (logits, *self.cache_contents(cache, past + 1))

    def step_runner(self, prompt, token: int, cache=None) -> Callable[[], object]:
        """One decoding step after ``prompt``, repeatable, with the runtime functions looked up and the inputs
        put on the device once, here; each call runs ``kv_state_begin_forward``, ``decode`` and
        ``kv_state_end_forward``, then pops the token again (``kv_state_popn``, so that every call does the
        same work), and returns the device logits. (``cache``: as in ``after_one_step``.)"""
        cache_object = self.new_cache()
        self.run("prefill", prompt, 0, cache_object)
        past = int(np.asarray(prompt).size)
        ids = tvm.runtime.tensor(np.array([token], dtype=PAGED_TOKEN_DTYPE), self.device)
        positions = tvm.runtime.tensor(np.array([past], dtype=PAGED_TOKEN_DTYPE), self.device)
        begin, end, popn = (_builtin(name) for name in ("kv_state_begin_forward", "kv_state_end_forward", "kv_state_popn"))
        decode, params, sequence, one = self.vm["decode"], self.params, ShapeTuple([SEQUENCE]), ShapeTuple([1])

        def run():
            begin(cache_object, sequence, one)
            logits, _ = decode(ids, positions, cache_object, params)
            end(cache_object)
            self.device.sync()
            popn(cache_object, SEQUENCE, 1)
            return logits

        return run


def paged_module(model: TinyGPT, target: tvm.target.Target | None = None,
                 block: type[nn.Module] = PagedBlock) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """``export``'s module with every ``Linear``'s weight transpose fused into its matmul
    (``FuseTransposeMatmul``, as MLC LLM does), and the weights: what ``compile_paged`` builds and what its
    tuning database is tuned on (``python -m helpers.maintainers.shipping paged``)."""
    mod, weights = export(model, target, block)
    return relax.transform.FuseTransposeMatmul()(mod), weights


def compile_paged(model: TinyGPT, target: tvm.target.Target | None = None,
                  block: type[nn.Module] = PagedBlock, database: Database | None = None) -> PagedDecoder:
    """Export ``model`` over a paged cache (its blocks of class ``block``) and build it (``paged_module``):
    TVM's default schedules, untuned, or with ``database`` (``databases.choose(DATABASE_NAME, ...)``) the
    static kernels it tuned (the decoding step's matmuls on one token; kernels over a symbolic length
    keep the default code)."""
    target = target or cpu_target()
    device = device_for(target)
    mod, weights = paged_module(model, target, block)
    if database is None:
        runnable, _, _ = build_runnable(mod, target)
    else:
        runnable = tuning.build_tuned(mod, target, database.path, prepack=False, transfer=database.transferred)
    vm = relax.VirtualMachine(runnable, device)
    return PagedDecoder(vm, [tvm.runtime.tensor(w, device) for w in weights], device, model.config)
