"""Whole generations as a user waits for them, each engine on the same prompt and file, and how often two
builds choose the same next token on a real text.

A decoding step timed alone leaves out what a user waits for: the prompt, and the trip each token makes
back to the program that chooses the next one. So each engine here answers one prompt greedily, its time
taken from the call to the last token, and the engines take turns (a round is one run of each), so that a
slow minute of the machine falls on all of them. PyTorch runs the float32 reference (``llm.reference_model``),
TVM the compiled step (``decoder.Decoder``), llama.cpp the same GGUF file where ``llama-cpp-python`` is
installed (``pip install llama-cpp-python==0.3.36`` builds it, about 15 minutes on two cores), and OpenVINO
GenAI the same file again (``openvino-genai``, in the course's environment: it converts the file when it loads).

Introduced on Day 15.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from . import decoder, llm, machine
from .accuracy import wilson
from .config import REPO

PYTORCH = "PyTorch eager, float32 weights"
TVM = "TVM, int8 x 4-bit (decoder)"
LLAMA_CPP = "llama.cpp (llama-cpp-python 0.3.36)"
OPENVINO_GENAI = "OpenVINO GenAI 2026.4.1"
LLAMA_CPP_INSTALL = ".venv/bin/python -m pip install -r requirements-benchmark.txt   (builds llama.cpp: about 15 minutes on two cores)"


@dataclass(frozen=True)
class Run:
    """One generation: seconds to the first new token (mostly the prompt), seconds in all, new tokens."""

    first_s: float
    total_s: float
    tokens: int


class _FirstToken:
    """A transformers streamer that notes when the first new token came (its first call hands over the prompt)."""

    def __init__(self) -> None:
        self.calls, self.at = 0, 0.0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def pytorch_engine(model, ids: list[int], new_tokens: int) -> Callable[[], Run]:
    """``new_tokens`` greedy tokens after ``ids`` from the float32 reference and its KV cache."""

    def run() -> Run:
        streamer = _FirstToken()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, streamer=streamer)
        return Run(streamer.at - start, time.perf_counter() - start, int(out.shape[1]) - len(ids))
    return run


def tvm_engine(step: decoder.Decoder, ids: list[int], new_tokens: int) -> Callable[[], Run]:
    """The same from TVM's compiled step: the prompt fed ``step.prefill_tokens`` tokens a call, each next token
    left on the device."""

    def run() -> Run:
        step.reset()
        start = time.perf_counter()
        best, _ = step.feed(ids)
        first = time.perf_counter()
        for _ in range(new_tokens - 1):
            best, _ = step.step(best)
        int(best.numpy()[0])
        return Run(first - start, time.perf_counter() - start, new_tokens)
    return run


def llama_cpp_engine(ids: list[int], new_tokens: int, path=None) -> Callable[[], Run] | None:
    """The same from llama.cpp, on the same file (SmolLM2's, or ``path``) and as many threads; None where it is not
    installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    model = Llama(model_path=str(path or llm.gguf_path()), n_threads=torch.get_num_threads(), n_ctx=decoder.MAX_CONTEXT,
                  verbose=False)

    def run() -> Run:
        # forget the last answer's tokens: llama-cpp-python reuses the cache of a prompt it has seen before, and
        # the first token would then cost one token's work instead of the prompt's
        model.reset()
        start = time.perf_counter()
        first, n = 0.0, 0
        for _ in model.generate(ids, temp=0, top_k=1, reset=True):
            n += 1
            if n == 1:
                first = time.perf_counter()
            if n == new_tokens:
                break
        return Run(first - start, time.perf_counter() - start, n)
    return run


def openvino_genai_engine(ids: list[int], new_tokens: int, path=None) -> Callable[[], Run] | None:
    """The same from OpenVINO GenAI's ``LLMPipeline`` on the same file (SmolLM2's, or ``path``), as many threads, its
    own defaults otherwise, each answer started afresh; None where it is not installed. It converts the GGUF file
    to its own model when it loads (seconds)."""
    try:
        import openvino as ov
        import openvino_genai
    except ImportError:
        return None
    # its prefix cache off: by default it keeps the last prompt's keys and values, and a prompt asked again would
    # cost only its last token (20 against 90 ms for 128 tokens of SmolLM2, measured on a Zen 4)
    fresh = openvino_genai.SchedulerConfig()
    fresh.enable_prefix_caching = False
    pipe = openvino_genai.LLMPipeline(str(path or llm.gguf_path()), "CPU", INFERENCE_NUM_THREADS=torch.get_num_threads(),
                                      scheduler_config=fresh)
    settings = openvino_genai.GenerationConfig()
    settings.max_new_tokens = settings.min_new_tokens = new_tokens
    settings.ignore_eos, settings.do_sample = True, False
    prompt = ov.Tensor(np.array([ids], dtype=np.int64))

    def run() -> Run:
        first: list[float] = []

        def streamer(_text: str) -> bool:
            if not first:
                first.append(time.perf_counter())
            return False  # False: go on
        start = time.perf_counter()
        out = pipe.generate(prompt, settings, streamer)
        end = time.perf_counter()
        return Run((first[0] if first else end) - start, end - start, len(out.tokens[0]))
    return run


def prompt_times(step: decoder.Decoder, ids: list[int], repeats: int) -> dict[str, list[float]]:
    """Milliseconds from an empty cache to the first new token, the prompt fed one token a step and
    ``step.prefill_tokens`` a call, in turns after one warm-up each: {"one token a step": [...], "N tokens a
    call": [...]}, each sorted."""
    ways = {"one token a step": False, f"{step.prefill_tokens} tokens a call": True}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(repeats + 1):
        for name, prefill in ways.items():
            step.reset()
            start = time.perf_counter()
            best, _ = step.feed(ids, prefill=prefill)
            best.numpy()
            if round_:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: sorted(t) for name, t in times.items()}


# A pause before each run, so that the last engine's idle threads have stopped spinning: TVM's pool keeps a core
# busy for about 0.19 s after its last parallel kernel (measured on a Zen 4), and an engine started sooner runs
# on one core less for its first tokens.
SETTLE_S = 0.3


def compare(engines: dict[str, Callable[[], Run]], repeats: int) -> dict[str, dict]:
    """Each engine ``repeats`` times, in rounds after one warm-up each: per engine the tokens per second over the
    whole answer and after the first token (median and range), and the first token's milliseconds. Each run
    starts ``SETTLE_S`` after the one before: thread pools wait for work by spinning for a while, and an engine
    started at once shares the cores with them."""
    for run in engines.values():
        run()
    runs: dict[str, list[Run]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, run in engines.items():
            time.sleep(SETTLE_S)
            runs[name].append(run())
    out = {}
    for name, done in runs.items():
        whole = sorted(r.tokens / r.total_s for r in done)
        after = sorted((r.tokens - 1) / (r.total_s - r.first_s) for r in done)
        out[name] = {"tokens": done[0].tokens, "tokens_per_s": float(np.median(whole)),
                     "tokens_per_s_range": [whole[0], whole[-1]], "decode_tokens_per_s": float(np.median(after)),
                     "decode_range": [after[0], after[-1]],
                     "first_token_ms": float(np.median([r.first_s for r in done]) * 1e3),
                     "first_token_range_ms": [min(r.first_s for r in done) * 1e3, max(r.first_s for r in done) * 1e3]}
    return out


def verdict(ours: dict, theirs: dict, rate: str = "decode") -> str:
    """Whether ``ours`` generated faster than ``theirs`` (``compare``'s rows) with the rounds' ranges apart, or the
    ranges overlap and the medians alone cannot say: ``rate`` "decode" (after the first token), "whole" or
    "first" (the time to the first token: the prompt's)."""
    if rate == "first":   # a time: the lower the faster
        ours, theirs = ({"rate": 1 / row["first_token_ms"], "span": [1 / row["first_token_range_ms"][1],
                                                                     1 / row["first_token_range_ms"][0]]}
                        for row in (ours, theirs))
        key, span = "rate", "span"
    else:
        key, span = ("decode_tokens_per_s", "decode_range") if rate == "decode" else ("tokens_per_s", "tokens_per_s_range")
    ratio = ours[key] / theirs[key]
    if ours[span][0] > theirs[span][1]:
        return f"{ratio:.2f}x, faster in every round"
    if ours[span][1] < theirs[span][0]:
        return f"{ratio:.2f}x, slower in every round"
    return f"{ratio:.2f}x, too close to call (the rounds' ranges overlap)"


def recorded(engine: str = LLAMA_CPP) -> list[tuple[str, dict]]:
    """What the reference machines measured for ``engine`` (``results/llm-*.json``): (CPU name, row) pairs."""
    found = []
    for path in sorted((REPO / "results").glob("llm-*.json")):
        record = json.loads(path.read_text())
        if engine in record.get("generation", {}):
            found.append((f"{record['machine']['cpu']}, {record['machine']['cores']} cores", record["generation"][engine]))
    return found


def real_text(tokens: int, tok) -> list[int]:
    """The first ``tokens`` tokens of English documentation every Python has (``pydoc_data.topics``: the
    language reference's sections), cut at a section's start."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    return tok(text[: tokens * 8], add_special_tokens=False)["input_ids"][:tokens]


def next_token_agreement(step: decoder.Decoder, model, ids: list[int]) -> dict:
    """How often TVM's step and the float32 reference choose the same next token, position by position, reading
    the same text ``ids`` (each sees the true text, not its own choices): the count, the share and its Wilson
    interval."""
    with torch.inference_mode():
        want = model(torch.tensor([ids])).logits[0].argmax(-1).numpy()
    step.reset()
    got = []
    for token in ids:
        best, _ = step.step(int(token))
        got.append(int(best.numpy()[0]))
    same = int(np.sum(np.array(got) == want))
    return {"agree": same, "positions": len(ids), "share": same / len(ids), "interval": wilson(same, len(ids))}
