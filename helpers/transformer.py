"""A small GPT through TVM (Day 14): a symbolic sequence length, buckets, and decoding with a KV cache.

Every model before Day 14 is a CNN called with one input shape. A language model is called with
another length on every request, and when it generates text it calls itself once per new token with
a growing past. Three ways to compile for that, each with its price:

- **one symbolic build**: ``torch.export.Dim`` marks the length dynamic, the Relax module takes
  ``(1, n)`` with ``n`` a symbolic variable, and one ``tvm.compile`` serves every length. Its kernels
  cannot be tuned (MetaSchedule needs static shapes), so they run TVM's default schedules;
- **buckets**: the length bound to a few sizes (``relax.transform.BindSymbolicVars``), each tuned like
  any static model; a request is padded up to its bucket;
- **prefill and decode** as two functions with the key/value cache as an explicit input and output,
  the past length symbolic: the prompt is processed once, then each new token costs one small call.

The model is GPT-2's layout (pre-LayerNorm blocks, learned positions, a GELU MLP) at a size that
compiles in seconds, with seeded random weights: nothing is downloaded, and speed and parity do not
depend on the weights.

Introduced on Day 14.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
import tvm
from torch import nn
from tvm import relax

from . import databases, peers, timing
from .build import CompiledModel, compile_model, device_for, load_executable, transform_params
from .errors import CourseError, InputShapeError
from .machine import cpu_target
from .models import ImportedModel, to_relax, torch_logs_held

TOKEN_DTYPE = "int64"
DYNAMIC, TUNED_BUCKET, SYMBOLIC = "torch.compile (dynamic)", "TVM bucket, tuned", "TVM, symbolic length"
DECODE_TVM = "TVM decode, symbolic past"
STEP_OUTPUTS = ("logits", "keys", "values")  # what a decoding step returns, in order
BUCKET = 64  # the prefill bucket Day 14 tunes and measures
BUCKETS = (BUCKET, 128)  # the prefill buckets whose tuning databases ship (make benchmark measures each)
BUCKET_PREFIX = "tinygpt_prefill"  # its database's model name, with the length appended
DECODE_NAME = "tinygpt_decode"  # the decoding step's database (its static kernels)
DECODE_TUNED = "TVM decode, static kernels tuned"


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes: vocabulary, width, blocks, attention heads and the longest sequence.

    ``kv_heads``: the key/value heads (grouped-query attention: each shared by ``heads // kv_heads`` query
    heads, as Llama-family models do); by default one per query head, as in GPT-2."""

    vocab: int = 512
    width: int = 128
    layers: int = 2
    heads: int = 4
    max_len: int = 256
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}: each key/value head is "
                             "shared by the same number of query heads.")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


class Block(nn.Module):
    """One pre-LayerNorm transformer block: causal self-attention, then an MLP, each with a residual.

    With fewer key/value heads than query heads (``config.kv_heads``), ``qkv`` computes every query head,
    then the key heads, then the value heads, and each key/value head serves a group of query heads."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.heads, config.kv_heads
        self.ln1, self.ln2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, (config.heads + 2 * config.kv_heads) * config.head_dim)
        self.proj = nn.Linear(config.width, config.width)
        self.fc, self.out = nn.Linear(config.width, 4 * config.width), nn.Linear(4 * config.width, config.width)

    def forward(self, x, past_k=None, past_v=None):
        batch, length, width = x.shape
        head_dim = width // self.heads
        kv_width = head_dim * self.kv_heads
        # every query head, then the key heads, then the value heads (as many as the cache holds)
        q, k, v = (t.view(batch, length, -1, head_dim).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split([width, kv_width, kv_width], dim=2))
        grouped = {"enable_gqa": True} if self.kv_heads != self.heads else {}  # each k, v head serves a group
        if past_k is None:  # prefill: every position sees itself and the positions before it
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, **grouped)
        else:  # decode: one new position, which may see the whole past and itself
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            attended = F.scaled_dot_product_attention(q, k, v, **grouped)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.out(F.gelu(self.fc(self.ln2(x)))), k, v


class TinyGPT(nn.Module):
    """A decoder-only transformer with seeded random weights.

    ``prefill(ids)`` runs a whole prompt and returns the logits and the cache (keys and values of every
    layer, shaped ``(layers, batch, kv_heads, length, head_dim)``); ``decode(ids, positions, keys, values)``
    runs new tokens against that cache and returns the logits and the longer cache.
    """

    def __init__(self, config: GPTConfig = GPTConfig(), seed: int = 0) -> None:
        super().__init__()
        self.config = config
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.tok, self.pos = nn.Embedding(config.vocab, config.width), nn.Embedding(config.max_len, config.width)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
            self.ln = nn.LayerNorm(config.width)
            self.head = nn.Linear(config.width, config.vocab, bias=False)
        self.eval()

    def prefill(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        keys, values = [], []
        for block in self.blocks:
            x, k, v = block(x)
            keys.append(k)
            values.append(v)
        return self.head(self.ln(x)), torch.stack(keys), torch.stack(values)

    def decode(self, ids, positions, past_keys, past_values):
        x = self.tok(ids) + self.pos(positions)
        keys, values = [], []
        for layer, block in enumerate(self.blocks):
            x, k, v = block(x, past_keys[layer], past_values[layer])
            keys.append(k)
            values.append(v)
        return self.head(self.ln(x)), torch.stack(keys), torch.stack(values)


class Prefill(nn.Module):
    """``model.prefill`` as a module's ``forward``: what torch.export and torch.compile take."""

    def __init__(self, model: TinyGPT) -> None:
        super().__init__()
        self.model = model
        self.eval()  # a new module starts in training mode, and the ONNX exporter warns about it

    def forward(self, ids):
        return self.model.prefill(ids)


class DynamicPrefill(Prefill):
    """``Prefill`` for ``torch.compile(dynamic=True)``: a ``forward`` (a code object) of its own.

    Dynamo keeps compiled code on ``forward``'s code object. Compiled after a static ``torch.compile``
    of a ``Prefill``, a dynamic one of the same class recompiled at the next length (measured: a third
    graph at length 70), so the timing at the first length was not a dynamic graph's. With its own
    class one graph served lengths 64, 70 and 90.
    """

    def forward(self, ids):
        return self.model.prefill(ids)


class Decode(nn.Module):
    """``model.decode`` as a module's ``forward``."""

    def __init__(self, model: TinyGPT) -> None:
        super().__init__()
        self.model = model
        self.eval()

    def forward(self, ids, positions, past_keys, past_values):
        return self.model.decode(ids, positions, past_keys, past_values)


def tokens(length: int, vocab: int = GPTConfig.vocab, seed: int = 0) -> torch.Tensor:
    """A batch of one random prompt of ``length`` token ids (no tokenizer: the weights are random too)."""
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ import


def export_to_relax(module: nn.Module, inputs: tuple, dynamic_shapes=None, decompose: bool = True,
            custom_convert_map: dict | None = None) -> tuple[tvm.IRModule, list]:
    """torch.export -> Relax with the weights detached; ``decompose=False`` keeps ``R.nn.attention`` whole;
    ``custom_convert_map`` replaces the importer's converters of some operators (``hugging_face``)."""
    with torch.no_grad(), torch_logs_held():  # several inputs (the decoding step's cache): models.export takes one
        program = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    return to_relax(program, decompose, custom_convert_map)


def import_prefill(model: TinyGPT, length: int | None = None, decompose: bool = True) -> ImportedModel:
    """The prefill as Relax: for one ``length``, or (None) for every length from 2 to ``max_len`` at once.

    With a symbolic length, torch names the variable (``s27``, say) and its bounds become the
    function's ``tir_var_lower_bound`` / ``tir_var_upper_bound`` attributes (``length_bounds``).
    torch.export treats sizes 0 and 1 as special cases, so the symbolic range starts at 2.
    """
    top = model.config.max_len
    if length is not None and not 1 <= length <= top:
        raise InputShapeError(f"length must be between 1 and the model's max_len ({top}), got {length}.")
    example = tokens(length or 8, model.config.vocab)
    dims = None if length else ({1: torch.export.Dim("length", min=2, max=top)},)
    mod, params = export_to_relax(Prefill(model), (example,), dims, decompose)
    return ImportedModel(mod=mod, params=params, input_shape=tuple(example.shape), input_dtype=TOKEN_DTYPE)


def empty_cache(model: TinyGPT, past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values for ``past`` earlier positions, zeros: the shape ``decode`` takes."""
    c = model.config
    shape = (c.layers, 1, c.kv_heads, past, c.head_dim)
    return torch.zeros(shape), torch.zeros(shape)


def import_decode(model: TinyGPT, step: type[nn.Module] = Decode) -> ImportedModel:
    """One decoding step as Relax, with a symbolic past length (1 to ``max_len - 1``).

    Inputs: the new token ``(1, 1)``, its position ``(1, 1)``, the past keys and values; outputs: the
    logits and the keys and values one position longer. The cache goes in and out explicitly: a
    cache kept in a ``register_buffer`` and changed in ``forward`` would be frozen into a constant.
    ``step``: the module made of ``model``, ``Decode`` or one with the same inputs (``greedy_decoding``).
    """
    keys, values = empty_cache(model, 8)
    past = torch.export.Dim("past", min=1, max=model.config.max_len - 1)
    ids, position = tokens(1, model.config.vocab), torch.tensor([[8]])
    mod, params = export_to_relax(step(model), (ids, position, keys, values), (None, None, {3: past}, {3: past}))
    return ImportedModel(mod=mod, params=params, input_shape=(1, 1), input_dtype=TOKEN_DTYPE)


def length_bounds(mod: tvm.IRModule, function: str = "main") -> dict[str, tuple[int, int]]:
    """Each symbolic variable of ``function`` with its (lowest, highest) value, as the importer recorded them."""
    attrs = mod[function].attrs or {}
    low, high = attrs.get("tir_var_lower_bound", {}), attrs.get("tir_var_upper_bound", {})
    names = [str(v) for v in relax.analysis.defined_symbolic_vars(mod[function])]
    return {name: (int(low.get(name, 0)), int(high[name]) if name in high else None) for name in names}


def bind_length(imported: ImportedModel, length: int) -> ImportedModel:
    """A static bucket: the symbolic length of ``imported`` replaced by ``length`` (``BindSymbolicVars``)."""
    bounds = length_bounds(imported.mod)
    if len(bounds) != 1:
        raise CourseError(f"bind_length takes a module with one symbolic length; this one has {sorted(bounds) or 'none'}.")
    (name, (low, high)), = bounds.items()
    if not low <= length <= high:
        raise InputShapeError(f"A bucket of {length} is outside the range the module was exported for ({low} to {high}).")
    mod = relax.transform.BindSymbolicVars({name: length})(imported.mod)
    return replace(imported, mod=mod, input_shape=(1, length))


# ------------------------------------------------------------------ compiled


@dataclass
class SymbolicLengthModel(CompiledModel):
    """A compiled prefill that accepts any length in ``bounds``; works with ``timing.tvm_runner`` and the rest."""

    bounds: tuple[int, int] = (2, 256)

    def check_input(self, array: np.ndarray) -> None:
        low, high = self.bounds
        if array.ndim != 2 or array.shape[0] != 1 or str(array.dtype) != TOKEN_DTYPE or not low <= array.shape[1] <= high:
            raise InputShapeError(
                f"This module takes (1, length) {TOKEN_DTYPE} token ids with {low} <= length <= {high}, "
                f"but got {tuple(array.shape)} {array.dtype}."
            )


def compile_symbolic(imported: ImportedModel, target: tvm.target.Target | None = None) -> SymbolicLengthModel:
    """One ``tvm.compile`` of a symbolic-length prefill, for every length it was exported for."""
    target = target or cpu_target()
    (_, bounds), = length_bounds(imported.mod).items()
    compiled = compile_model(imported, target)
    return SymbolicLengthModel(**vars(compiled), bounds=bounds)


def outputs(result) -> list[np.ndarray]:
    """A VM result (a tuple of tensors) as NumPy arrays."""
    return [t.numpy() for t in result]


@dataclass
class Decoder:
    """The compiled decoding step; ``step`` keeps the cache on the device between calls."""

    compiled: CompiledModel

    def step(self, token: int, position: int, keys, values):
        """(logits, keys, values) after one more token; ``keys``/``values`` as NumPy, torch or TVM tensors."""
        device = self.compiled.device
        on_device = [tvm.runtime.tensor(np.array([[value]], dtype=TOKEN_DTYPE), device) for value in (token, position)]
        caches = [c if isinstance(c, tvm.runtime.Tensor) else tvm.runtime.tensor(np.asarray(c), device)
                  for c in (keys, values)]
        logits, keys, values = self.compiled.vm["main"](*on_device, *caches, *self.compiled.params)
        return logits, keys, values

    def step_runner(self, prompt, token: int, cache) -> Callable[[], object]:
        """One decoding step after ``prompt``, whose keys and values are ``cache``, repeatable (the cache stays as
        it is), with nothing but the VM call and a sync timed: the token, its position and the cache are put on
        the device once, here; each call returns the device tensors (logits, keys, values)."""
        device, past = self.compiled.device, int(np.asarray(prompt).size)
        inputs = [tvm.runtime.tensor(np.array([[value]], dtype=TOKEN_DTYPE), device) for value in (token, past)]
        inputs += [tvm.runtime.tensor(c.numpy(), device) for c in cache]
        main, params = self.compiled.vm["main"], self.compiled.params

        def run():
            out = main(*inputs, *params)
            device.sync()
            return out

        return run

    def after_one_step(self, prompt, token: int, cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The logits, keys and values (NumPy, the cache ``past + 1`` positions long) after one step of
        ``token`` following ``prompt``, whose keys and values are ``cache``: what a runner is checked by."""
        return tuple(t.numpy() for t in self.step(token, int(np.asarray(prompt).size), *cache))


def compile_decoder(imported: ImportedModel, target: tvm.target.Target | None = None,
                    database: databases.Database | None = None) -> Decoder:
    """``import_decode``'s module built once for every past length: plain ``tvm.compile``, or with a
    ``database`` whose schedules cover the static kernels (``tune_decode``), the others left untuned."""
    target = target or cpu_target()
    device_for(target)
    if database is not None:
        return Decoder(database.compile(imported, target))
    return Decoder(compile_model(imported, target))


# ------------------------------------------------------------------ timing


def prefill_runners(model: TinyGPT, ids: torch.Tensor, tuned: CompiledModel, symbolic: CompiledModel,
                    which: Sequence[str] | None = None) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """Prefill of ``ids`` by every engine, as runners for ``timing.measure_engines``, and the peers missing.

    The peers (``peers.peers``: eager and, per ``which``, torch.compile, with freezing, ONNX Runtime,
    OpenVINO), ``torch.compile(dynamic=True)``, the tuned bucket and the symbolic build; each is checked
    against eager's logits first (``ParityError`` otherwise).
    """
    found = peers.peers(Prefill(model), ids, which=which)
    runners = {**found.runners, DYNAMIC: timing.torch_runner(torch.compile(DynamicPrefill(model), dynamic=True), ids),
               TUNED_BUCKET: timing.tvm_runner(tuned, ids), SYMBOLIC: timing.tvm_runner(symbolic, ids)}
    peers.check_against_eager(runners, (DYNAMIC, TUNED_BUCKET, SYMBOLIC))
    return runners, found.missing


# ------------------------------------------------------------------ generation

# A prefill step: prompt ids (1, n) -> (logits (1, n, vocab) as NumPy, cache); a decode step:
# (token, position, cache) -> (logits (1, 1, vocab) as NumPy, cache). The cache is whatever the
# steps pass each other: the caller only hands it on.
PrefillStep = Callable[[np.ndarray], tuple[np.ndarray, object]]
DecodeStep = Callable[[int, int, object], tuple[np.ndarray, object]]


def torch_steps(model: TinyGPT) -> tuple[PrefillStep, DecodeStep]:
    """PyTorch eager's prefill and decode steps for ``model``."""

    def prefill(ids):
        with torch.inference_mode():
            logits, keys, values = model.prefill(torch.as_tensor(np.asarray(ids)))
        return logits.numpy(), (keys, values)

    def decode(token, position, cache):
        with torch.inference_mode():
            logits, keys, values = model.decode(torch.tensor([[token]]), torch.tensor([[position]]), *cache)
        return logits.numpy(), (keys, values)

    return prefill, decode


def tvm_steps(prefill_model: CompiledModel, decoder: Decoder) -> tuple[PrefillStep, DecodeStep]:
    """TVM's prefill and decode steps: the cache stays on TVM's device from the prompt to the last token."""

    def prefill(ids):
        logits, keys, values = prefill_model.run_on_device(prefill_model.to_device(np.asarray(ids)))
        return logits.numpy(), (keys, values)

    def decode(token, position, cache):
        logits, keys, values = decoder.step(token, position, *cache)
        return logits.numpy(), (keys, values)

    return prefill, decode


def tokens_without_cache(model: TinyGPT, prompt, count: int) -> list[int]:
    """``count`` greedy tokens computed the slow way, the whole sequence again for each: a reference."""
    ids = torch.as_tensor(np.asarray(prompt))
    found = []
    with torch.inference_mode():
        for _ in range(count):
            logits, _, _ = model.prefill(ids)
            found.append(int(logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[found[-1]]])], dim=1)
    return found


# ------------------------------------------------------------------ shipped databases


def bucket_name(length: int) -> str:
    """The tuning database's model name for a prefill bucket of ``length`` tokens, e.g. ``tinygpt_prefill64``."""
    return f"{BUCKET_PREFIX}{length}"


# ------------------------------------------------------------------ builds and peers shown step by step (Day 14)


def symbolic_model(executable: tvm.runtime.Executable, imported: ImportedModel,
                   target: tvm.target.Target | None = None) -> SymbolicLengthModel:
    """An executable built from a symbolic-length prefill (``tvm.compile`` of ``imported.mod``), loaded with
    its weights; it takes the lengths the module was exported for (``length_bounds``) and refuses others."""
    target = target or cpu_target()
    (_, bounds), = length_bounds(imported.mod).items()
    return SymbolicLengthModel(**vars(load_executable(executable, imported, target)), bounds=bounds)


def compile_with_passes(imported: ImportedModel, target: tvm.target.Target | None, passes: Sequence) -> CompiledModel:
    """``passes`` run on ``imported.mod`` under ``target``, then ``tvm.compile`` (its default pipeline does
    the rest) and loaded: a ``SymbolicLengthModel`` for a module with a symbolic length. When the passes
    lifted weight-only work (``LiftTransformParams``), ``main_transform_params`` runs once here, on the weights."""
    target = target or cpu_target()
    with target:
        mod = tvm.transform.Sequential(list(passes))(imported.mod)
    compiled = compile_model(replace(imported, mod=mod), target)
    if length_bounds(imported.mod):
        (_, bounds), = length_bounds(imported.mod).items()
        compiled = SymbolicLengthModel(**vars(compiled), bounds=bounds)
    return transform_params(compiled)


def scheduled_kernels(mod: tvm.IRModule) -> tuple[list[str], list[str]]:
    """(kernels a schedule rule marked scheduled, ``tirx.is_scheduled``; kernels left as they were)."""
    done, left = [], []
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            (done if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False) else left).append(gv.name_hint)
    return sorted(done), sorted(left)


def layer_norm_module(rows: int, width: int) -> tvm.IRModule:
    """One layer norm over ``(1, rows, width)`` as Relax, legalized into its kernel (``layer_norm``), with a weight
    and a bias: what a decoding step (one row, its token) and a prefill (a row per token) run in every block."""
    x = relax.Var("x", relax.TensorType([1, rows, width], "float32"))
    weight, bias = (relax.Var(name, relax.TensorType([width], "float32")) for name in ("weight", "bias"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, weight, bias]):
        builder.emit_func_output(builder.emit(relax.op.nn.layer_norm(x, weight, bias, axes=[-1])))
    return relax.transform.LegalizeOps()(builder.get())


class DynamicDecode(Decode):
    """``Decode`` for ``torch.compile(dynamic=True)``, with a ``forward`` (a code object) of its own, as
    ``DynamicPrefill``: one graph serves every past length, as a decoding loop needs."""

    def forward(self, ids, positions, past_keys, past_values):
        return self.model.decode(ids, positions, past_keys, past_values)


def decode_peers(model: TinyGPT, past: int, which: Sequence[str] = (peers.COMPILED, peers.ORT, peers.OPENVINO),
                 token: int = 7) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """One decoding step after ``past`` positions by PyTorch's peers, as runners, and the peers missing.

    Eager always; per ``which``: ``peers.COMPILED``, ``torch.compile(dynamic=True)`` of the step (compiled by
    a first call here; a static compile would compile again at every new past length), and ``peers.ORT`` and
    ``peers.OPENVINO``, ONNX Runtime and OpenVINO (float32) on one ONNX export of the step with the past
    dimension dynamic. Each is checked against eager on the logits, keys and values (``ParityError``
    otherwise); a peer that cannot be built is missing, with why.
    """
    prompt = tokens(past, model.config.vocab, seed=past)
    with torch.inference_mode():
        _, keys, values = model.prefill(prompt)
    inputs = (torch.tensor([[token]]), torch.tensor([[past]]), keys, values)

    def eager():
        with torch.inference_mode():
            return model.decode(*inputs)

    runners, missing = {peers.EAGER: eager}, {}
    if peers.COMPILED in which:
        compiled = torch.compile(DynamicDecode(model), dynamic=True)

        def compiled_step():
            with torch.inference_mode():
                return compiled(*inputs)

        compiled_step()  # compiles
        runners[peers.COMPILED] = compiled_step
    onnx_engines = [label for label in peers.ONNX_ENGINES if label in which]
    if onnx_engines:
        try:
            exported = decode_onnx(Decode(model), inputs, model.config.max_len)
        except Exception as err:  # an exporter failure: every ONNX engine is missing, with the reason
            missing |= {label: peers.why_missing(label, err) for label in onnx_engines}
        else:
            for label in onnx_engines:
                try:
                    runners[label] = peers.OnnxEngine(label, exported).runner(inputs)
                except Exception as err:  # a loader or compiler failure: this engine is missing, with the reason
                    missing[label] = peers.why_missing(label, err)
    want = [t.numpy() for t in eager()]
    for label, run in runners.items():
        got = [t.numpy() if hasattr(t, "numpy") else np.asarray(t) for t in run()]
        peers.check_outputs(label, got, want, STEP_OUTPUTS)
    return runners, missing


def decode_onnx(step: nn.Module, inputs: tuple, max_len: int) -> bytes:
    """A decoding step (``Decode``, or a module with its inputs) exported to ONNX with the past dimension
    dynamic (1 to ``max_len - 1``), serialized."""
    past = torch.export.Dim("past", min=1, max=max_len - 1)
    with torch_logs_held(), warnings.catch_warnings():
        # the exporter notes that keys and values share one dynamic axis: that is what is meant
        warnings.filterwarnings("ignore", message="# The axis name", category=UserWarning)
        program = torch.onnx.export(step, inputs, dynamo=True, verbose=False,
                                    dynamic_shapes=(None, None, {3: past}, {3: past}))
    return program.model_proto.SerializeToString()


def step_runners(model: TinyGPT, decoders: dict, past: int, token: int = 7) -> dict[str, Callable[[], object]]:
    """One decoding step after ``past`` positions, eager and by each of ``decoders`` (label -> a ``Decoder``
    or a ``paged_cache.PagedDecoder``), as runners that time like with like: inputs on the device and
    functions looked up before, device tensors returned (no copy to NumPy). Each decoder is first checked
    against eager on the logits and on its cache after the step (``ParityError`` otherwise)."""
    prompt = tokens(past, model.config.vocab, seed=past)
    with torch.inference_mode():
        _, keys, values = model.prefill(prompt)
    ids, position = torch.tensor([[token]]), torch.tensor([[past]])

    def eager():
        with torch.inference_mode():
            return model.decode(ids, position, keys, values)

    want = [t.numpy() for t in eager()]
    runners = {peers.EAGER: eager}
    for label, decoder in decoders.items():
        peers.check_outputs(label, decoder.after_one_step(prompt.numpy(), token, (keys, values)), want, STEP_OUTPUTS)
        runners[label] = decoder.step_runner(prompt.numpy(), token, (keys, values))
    return runners

