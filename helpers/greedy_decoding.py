"""Whole greedy generations of TinyGPT by every engine, the next token chosen inside each engine's step.

A decoding step timed alone leaves out what a user waits for: the prompt, then one step per new token, and
between two steps whatever carries the token from one to the next. Chosen in Python, every token's logits
come back to NumPy, the argmax is taken there, and the token and its position go back as new tensors.
Here the step itself ends in the choice (``GreedyDecode``: the argmax of the logits and the position plus
one are part of what is compiled), so one step's outputs are the next step's inputs as they are: two
(1, 1) integer tensors and the cache, kept by TVM on its device and by PyTorch in its own tensors. The
tokens are read once, at the end. Each engine runs the same loop (``generate``) on its own step.

Introduced on Day 14.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import tvm

from . import databases, peers, transformer
from .build import CompiledModel
from .errors import ParityError
from .machine import cpu_target
from .models import ImportedModel
from .paged_cache import PagedDecoder

TVM = "TVM, the choice in the compiled step"
TVM_NUMPY = "TVM, the choice in NumPy"  # the plain step, each token's logits to NumPy and back


class GreedyDecode(torch.nn.Module):
    """``model.decode`` followed by the greedy choice: (next token, next position, keys, values), each
    ready to be the next step's input."""

    def __init__(self, model: transformer.TinyGPT) -> None:
        super().__init__()
        self.model = model
        self.eval()

    def forward(self, ids, positions, past_keys, past_values):
        logits, keys, values = self.model.decode(ids, positions, past_keys, past_values)
        # argmax over the vocabulary of the (1, 1, vocab) logits is the (1, 1) token itself. Not
        # logits[:, -1].argmax(-1, keepdim=True): TVM's importer turns the index -1 into a `take` in
        # its "fast" mode, which does not wrap negative indices, and the tokens came out wrong.
        return logits.argmax(-1), positions + 1, keys, values


class DynamicGreedyDecode(GreedyDecode):
    """``GreedyDecode`` for ``torch.compile(dynamic=True)``, with a ``forward`` of its own (see
    ``transformer.DynamicPrefill``): one graph for every past length."""

    def forward(self, ids, positions, past_keys, past_values):
        return super().forward(ids, positions, past_keys, past_values)


# A step: (token, position, keys, values) -> the same four, one position on; a start: the prompt's ids
# (1, n) -> the same four after the prompt. Each engine keeps them in its own kind of tensor.
Step = Callable[..., Sequence]
Start = Callable[[np.ndarray], Sequence]


def generate(start: Start, step: Step, prompt, count: int) -> list[int]:
    """The ``count`` greedy tokens after ``prompt``: ``start`` once, then ``count - 1`` steps, each fed
    the previous step's outputs unchanged; the tokens are read as ints after the last step."""
    state = start(np.asarray(prompt))
    found = [state[0]]
    for _ in range(count - 1):
        state = step(*state)
        found.append(state[0])
    return [int(np.asarray(t.numpy() if hasattr(t, "numpy") else t).reshape(-1)[0]) for t in found]


def import_greedy_decode(model: transformer.TinyGPT) -> ImportedModel:
    """``GreedyDecode`` as Relax, the past symbolic (1 to ``max_len - 1``), as ``transformer.import_decode``."""
    return transformer.import_decode(model, GreedyDecode)


def compile_greedy_decode(imported: ImportedModel, target: tvm.target.Target | None = None,
                          database: databases.Database | None = None) -> CompiledModel:
    """``import_greedy_decode``'s step built once for every past length; with the decoding step's
    ``database``, the kernels it shares with the plain step are tuned (the argmax and the add are not in
    that database and keep TVM's default code)."""
    return transformer.compile_decoder(imported, target or cpu_target(), database).compiled


def _first_choice(logits) -> np.ndarray:
    """The prompt's next token as a (1, 1) array: the argmax of its last position's logits."""
    return np.asarray(logits)[:, -1].argmax(-1).reshape(1, 1).astype(transformer.TOKEN_DTYPE)


def tvm_loop(prefill: CompiledModel, greedy: CompiledModel) -> tuple[Start, Step]:
    """TVM's start (the prefill bucket; its logits come to NumPy once, for the first token) and greedy step,
    every tensor between two steps left on the device."""
    device, main, params = greedy.device, greedy.vm["main"], greedy.params

    def start(ids):
        logits, keys, values = prefill.run_on_device(prefill.to_device(ids))
        first = [tvm.runtime.tensor(a, device) for a in (_first_choice(logits.numpy()),
                                                          np.array([[ids.shape[1]]], dtype=transformer.TOKEN_DTYPE))]
        return (*first, keys, values)

    def step(token, position, keys, values):
        return main(token, position, keys, values, *params)

    return start, step


def tvm_numpy_loop(prefill: CompiledModel, decoder: transformer.Decoder) -> tuple[Start, Step]:
    """TVM's start and plain step (``transformer.Decoder``), the token chosen in NumPy between two steps: each
    step's logits come to NumPy, and the token and its position go back as new tensors; the cache stays on
    the device."""

    def start(ids):
        logits, keys, values = prefill.run_on_device(prefill.to_device(ids))
        return int(_first_choice(logits.numpy())[0, 0]), ids.shape[1], keys, values

    def step(token, position, keys, values):
        logits, keys, values = decoder.step(token, position, keys, values)
        return int(logits.numpy()[0, -1].argmax()), position + 1, keys, values

    return start, step


def paged_loop(paged: PagedDecoder) -> tuple[Start, Step]:
    """The paged cache's start and step (``paged_cache.PagedDecoder``), the token chosen in NumPy between two
    steps; the state is (token, position, cache), the cache the runtime object that each step appends to."""

    prefill, decode = paged.steps()

    def start(ids):
        logits, cache = prefill(ids)
        return int(_first_choice(logits)[0, 0]), int(np.asarray(ids).shape[1]), cache

    def step(token, position, cache):
        logits, cache = decode(token, position, cache)
        return int(_first_choice(logits)[0, 0]), position + 1, cache

    return start, step


def torch_loop(model: transformer.TinyGPT, decode: torch.nn.Module | None = None) -> tuple[Start, Step]:
    """PyTorch's start and greedy step (eager, or ``decode``: a compiled ``GreedyDecode``), in inference mode,
    every tensor between two steps a PyTorch tensor."""
    decode = GreedyDecode(model) if decode is None else decode

    def start(ids):
        with torch.inference_mode():
            logits, keys, values = model.prefill(torch.as_tensor(ids))
            return logits[:, -1:].argmax(-1), torch.tensor([[ids.shape[1]]]), keys, values

    def step(*state):
        with torch.inference_mode():
            return decode(*state)

    return start, step


def onnx_loop(engine: str, model: transformer.TinyGPT, prompt) -> tuple[Start, Step]:
    """ONNX Runtime's or OpenVINO's start (the prefill exported at the prompt's length) and greedy step
    (exported with the past dynamic), fed NumPy arrays through each engine's plain API (``peers.OnnxEngine``)."""
    prompt = torch.as_tensor(np.asarray(prompt))
    prefill = peers.OnnxEngine(engine, peers.onnx_export(transformer.Prefill(model), prompt))
    greedy = peers.OnnxEngine(engine, _greedy_onnx(model))

    def start(ids):
        logits, keys, values = prefill.run([ids])
        return _first_choice(logits), np.array([[ids.shape[1]]], dtype=transformer.TOKEN_DTYPE), keys, values

    def step(*state):
        return greedy.run(state)

    return start, step


def _greedy_onnx(model: transformer.TinyGPT) -> bytes:
    """``GreedyDecode`` exported to ONNX with the past dimension dynamic, serialized."""
    keys, values = transformer.empty_cache(model, 8)
    inputs = (transformer.tokens(1, model.config.vocab), torch.tensor([[8]]), keys, values)
    return transformer.decode_onnx(GreedyDecode(model), inputs, model.config.max_len)


def runners(model: transformer.TinyGPT, prefill: CompiledModel, greedy: CompiledModel, decoder: transformer.Decoder,
            prompt, count: int, which: Sequence[str] = (peers.COMPILED, peers.FROZEN, peers.ORT, peers.OPENVINO)
            ) -> tuple[dict[str, Callable[[], list[int]]], dict[str, str]]:
    """A whole generation of ``count`` tokens after ``prompt`` by eager PyTorch, TVM (``prefill``, a bucket
    of the prompt's length, then ``greedy``, ``compile_greedy_decode``'s step, and for comparison
    ``decoder``'s plain step with the choice in NumPy) and the peers in ``which``, as runners for
    ``timing.measure_engines``, and the peers missing, with why. Every engine's tokens are checked against
    eager's first (``ParityError`` otherwise)."""
    loops = {peers.EAGER: torch_loop(model), TVM: tvm_loop(prefill, greedy), TVM_NUMPY: tvm_numpy_loop(prefill, decoder)}
    missing = {}
    if peers.COMPILED in which:
        loops[peers.COMPILED] = torch_loop(model, torch.compile(DynamicGreedyDecode(model), dynamic=True))
    if peers.FROZEN in which:  # the weights folded in as constants, as TVM's lifted ones are
        loops[peers.FROZEN] = torch_loop(model, peers.FrozenCompiled(DynamicGreedyDecode(model)))
    for engine in (e for e in peers.ONNX_ENGINES if e in which):
        try:
            loops[engine] = onnx_loop(engine, model, prompt)
        except Exception as err:  # an exporter, loader or compiler failure: this engine is missing, with why
            missing[engine] = peers.why_missing(engine, err)
    found = {label: (lambda loop=loop: generate(*loop, prompt, count)) for label, loop in loops.items()}
    want = found[peers.EAGER]()
    for label, run in found.items():
        got = run()  # torch.compile compiles here, before any timing
        if got != want:
            raise ParityError(f"{label} chose other tokens than PyTorch eager: {got} against {want}.")
    return found, missing
