"""Hugging Face ``transformers`` models through TVM (Day 14): a real architecture beside the course's
TinyGPT, built from a small config (random weights: nothing is downloaded), exported and imported.

transformers 5 builds its attention mask inside ``forward``, and looks there for packed sequences with a
``cumsum`` over a boolean tensor. PyTorch sums booleans as int64; TVM 0.27's importer keeps the input's
dtype, so the Relax module holds a *boolean* cumsum, which LLVM cannot add: ``tvm.compile`` stops with
``Check failed: (t.MatchesCode(DLDataTypeCode::kDLFloat))``. ``cumsum_as_torch`` converts ``aten.cumsum``
with the dtype PyTorch's own result had (``torch.export`` records it on every node).

Introduced on Day 14.
"""

from __future__ import annotations

import torch
import tvm
from torch import nn
from tvm import relax

from . import ir
from .models import ImportedModel, dtype_name, quiet
from .transformer import export_to_relax

FAMILIES = ("gpt2", "llama")


class LogitsOnly(nn.Module):
    """A causal language model called with token ids only, returning its logits: no cache, no dict."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.eval()

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def small_model(family: str, vocab: int = 512, width: int = 128, layers: int = 2, heads: int = 4,
                seed: int = 0) -> LogitsOnly:
    """A GPT-2 or Llama of ``transformers`` built from a small config, with seeded random weights.

    Llama's differences from GPT-2: rotary positions instead of learned ones, RMSNorm, a gated SiLU MLP
    and grouped-query attention (half as many key/value heads as query heads here).
    """
    if family not in FAMILIES:
        raise ValueError(f"Unknown model family {family!r}: choose one of {FAMILIES}.")
    # transformers loads its classes (and torchao with them) when they are first named; torchao registers
    # two enums the deprecated way, which torch logs as warnings: nothing a learner can act on
    with quiet("torch.utils._pytree"):
        import transformers  # seconds: only when a model is asked for (its classes load when first named)

        if family == "gpt2":
            config = transformers.GPT2Config(vocab_size=vocab, n_positions=256, n_embd=width, n_layer=layers, n_head=heads,
                                             bos_token_id=0, eos_token_id=0)
            build = transformers.GPT2LMHeadModel
        else:
            config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=8 * width // 3,
                                              num_hidden_layers=layers, num_attention_heads=heads,
                                              num_key_value_heads=max(1, heads // 2), max_position_embeddings=256,
                                              bos_token_id=0, eos_token_id=0)
            build = transformers.LlamaForCausalLM
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return LogitsOnly(build(config).eval())


def cumsum_as_torch(node, importer) -> relax.Var:
    """``aten.cumsum`` as Relax, in the dtype PyTorch's result had (int64 for booleans and small integers)."""
    x = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
    return importer.block_builder.emit(relax.op.cumsum(x, dim, dtype_name(node.meta["val"])))


# Converters the importer takes in place of its own (from_exported_program's custom_convert_map).
CONVERTERS = {"cumsum.default": cumsum_as_torch}


def import_model(model: LogitsOnly, ids: torch.Tensor, fixed: bool = True) -> ImportedModel:
    """``model`` on ``ids`` through torch.export into Relax, weights detached; ``fixed=False`` imports with
    TVM's own converters only (a module that does not build, see the module's docstring)."""
    mod, params = export_to_relax(model, (ids,), custom_convert_map=CONVERTERS if fixed else None)
    return ImportedModel(mod=mod, params=params, input_shape=tuple(ids.shape), input_dtype=dtype_name(ids))


def boolean_cumsums(mod: tvm.IRModule) -> list[relax.Call]:
    """The cumsum calls of ``main`` whose result is boolean: what LLVM cannot build."""
    return [call for call in ir.calls(mod, "cumsum") if call.ty.dtype == "bool"]
