"""The LLM's roofline on this machine: how fast TVM's 4-bit matrix-vector products read a real model's weights,
against the read bandwidth measured in the same run and PyTorch generating with the same weights in float32.

``python -m helpers.maintainers.llm_roofline`` writes ``results/llm-<cpu>-<cores>cores.json`` (and ``.md``):

* the read bandwidth (``qgemv.read_bandwidth_gbs``), the bytes SmolLM2-135M reads per token, and the ceiling in
  tokens/s they give;
* one token's matrix-vector products, all 210 Q4_1 matrices of the real file back to back (the Q8_0 output layer
  and attention are not in it), with DLight's rule, with the course's float roofline schedule and with the int8
  kernel (``qgemv.int8_gemv``; quantizing each input, done once per token in NumPy, is not timed), interleaved:
  ms per token, GB/s and the share of the read bandwidth;
* the same for a model of TinyLlama-1.1B's shapes (random weights, the course's quantizer, ``LAYERS_1B`` layers: far
  beyond the caches), where bandwidth dominates;
* whole generations of 64 tokens, as a user waits for them, in rounds: PyTorch (float32 weights dequantized from the
  file, its KV cache), TVM's step (``helpers.decoder``: the prompt fed one token a step) and llama.cpp where
  ``llama-cpp-python`` is installed: tokens/s over the whole answer and after the first token, the prompt's time.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch
import tvm

from .. import decoder, int8, llm, machine, qgemv, timing
from ..results import results_path, save_record

# TinyLlama-1.1B: width 2048, 22 layers, 32 query and 4 key-value heads of 64, MLP 5632.
SHAPES_1B = {"q": (2048, 2048), "k": (256, 2048), "v": (256, 2048), "o": (2048, 2048), "gate": (5632, 2048),
             "up": (5632, 2048), "down": (2048, 5632)}
LAYERS_1B = 4
QUESTION = "Explain what a compiler does."


def _token_runner(kernels: dict[tuple[int, int], tvm.runtime.Module], matrices: list[qgemv.Q4Matrix], int8_input: bool):
    """One token's products: each matrix times a vector of its width, back to back (``int8_input``: the vector
    quantized beforehand, as a decoder quantizes each layer's input once for the matrices that read it)."""
    rng = np.random.default_rng(0)
    calls = []
    for m in matrices:
        x = rng.normal(size=m.shape[1]).astype(np.float32)
        args = qgemv.int8_arguments(m, qgemv.quantize_activation(x)) if int8_input else qgemv.arguments(m, x)
        calls.append((kernels[m.shape]["main"], args))

    def run():
        for fn, args in calls:
            fn(*args)
    return run


def products(matrices: list[qgemv.Q4Matrix], bandwidth_gbs: float, repeats: int) -> dict:
    """DLight's schedule, the float roofline schedule and the int8 kernel over ``matrices``, interleaved: ms per
    token, GB/s and the share of the read bandwidth."""
    shapes = sorted({m.shape for m in matrices})
    instruction = int8.int8_instruction(machine.cpu_target())
    builds = {"DLight cpu.GEMV": lambda s: qgemv.dlight_schedule(qgemv.gemv(*s)),
              "roofline schedule, float32 x": lambda s: qgemv.roofline_schedule(qgemv.gemv(*s)),
              f"int8 x, {instruction} dot products": lambda s: qgemv.int8_gemv(*s, instruction)}
    runners = {label: _token_runner({s: qgemv.build(make(s)) for s in shapes}, matrices, label.startswith("int8"))
               for label, make in builds.items()}
    nbytes = sum(m.nbytes for m in matrices)
    rows = {}
    for t in timing.measure(runners, repeats=repeats):
        gbs = nbytes / (t.median_ms * 1e6)
        rows[t.label] = {"median_ms": t.median_ms, "q1_ms": t.q1_ms, "q3_ms": t.q3_ms, "gb_per_s": gbs,
                         "share_of_bandwidth": gbs / bandwidth_gbs}
    return {"matrices": len(matrices), "bytes": nbytes, "schedules": rows}


@dataclass(frozen=True)
class Run:
    """One generation: seconds to the first new token (the prompt's cost), seconds in all, new tokens."""

    first_s: float
    total_s: float
    tokens: int


def pytorch_engine(ids: list[int], new_tokens: int):
    model = llm.reference_model()

    def run() -> Run:
        streamer = _FirstToken()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, streamer=streamer)
        total = time.perf_counter() - start
        return Run(streamer.at - start, total, int(out.shape[1]) - len(ids))
    return run


class _FirstToken:
    """A transformers streamer that notes when the first new token came."""

    def __init__(self) -> None:
        self.calls, self.at = 0, 0.0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:   # the first call hands over the prompt
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def tvm_engine(ids: list[int], new_tokens: int):
    step = decoder.Decoder(decoder.load_weights())

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


def llama_cpp_engine(ids: list[int], new_tokens: int):
    """llama.cpp through llama-cpp-python, on the same file and threads; None where it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    model = Llama(model_path=str(llm.gguf_path()), n_threads=machine.core_count(), n_ctx=decoder.MAX_CONTEXT,
                  verbose=False)

    def run() -> Run:
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


def generation(new_tokens: int, repeats: int) -> dict:
    """Each engine answers ``QUESTION`` greedily, ``new_tokens`` tokens, in rounds (one run of each engine a
    round): tokens/s over the whole answer as a user waits for it, and over the new tokens after the first."""
    ids = llm.chat_ids(llm.tokenizer(), QUESTION)[0].tolist()
    engines = {"PyTorch eager, float32 weights": pytorch_engine(ids, new_tokens),
               "TVM, int8 x 4-bit (helpers.decoder)": tvm_engine(ids, new_tokens),
               "llama.cpp (llama-cpp-python 0.3.36)": llama_cpp_engine(ids, new_tokens)}
    engines = {name: run for name, run in engines.items() if run is not None}
    for run in engines.values():
        run()   # warm-up
    runs: dict[str, list[Run]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, run in engines.items():
            runs[name].append(run())
    out = {}
    for name, done in runs.items():
        whole = sorted(r.tokens / r.total_s for r in done)
        decode = sorted((r.tokens - 1) / (r.total_s - r.first_s) for r in done)
        out[name] = {"tokens": done[0].tokens, "prompt_tokens": len(ids),
                     "tokens_per_s": float(np.median(whole)), "tokens_per_s_range": [whole[0], whole[-1]],
                     "decode_tokens_per_s": float(np.median(decode)), "decode_range": [decode[0], decode[-1]],
                     "first_token_ms": float(np.median([r.first_s for r in done]) * 1e3)}
    return out


def measure(repeats: int = 9) -> dict:
    threads = machine.core_count()
    torch.set_num_threads(threads)
    bandwidth = qgemv.read_bandwidth_gbs()
    r = llm.reader()
    real = [llm.q4_matrix(t.name) for t in r.tensors if t.tensor_type.name == "Q4_1"]
    rng = np.random.default_rng(0)
    big = [qgemv.quantize(rng.normal(size=s).astype(np.float32)) for _ in range(LAYERS_1B) for s in SHAPES_1B.values()]
    per_token = llm.bytes_per_token()
    return {
        "machine": {"cpu": machine.cpu_name(), "cores": threads}, "threads": threads,
        "read_bandwidth_gbs": bandwidth, "bytes_per_token": per_token,
        "ceiling_tokens_per_s": llm.ceiling_tokens_per_s(per_token, bandwidth),
        "smollm2_q4_products": products(real, bandwidth, repeats),
        "tinyllama_shapes_q4_products": {"layers": LAYERS_1B, **products(big, bandwidth, repeats)},
        "generation": generation(64, 5),
    }


def markdown(record: dict) -> str:
    """The record as the page a reader opens beside the JSON."""
    lines = [f"# SmolLM2-135M's 4-bit products against the memory roofline: {record['machine']['cpu']}, "
             f"{record['threads']} threads", "", f"Measured {record['measured']} by `python -m helpers.maintainers.llm_roofline`.",
             "", table(record)]
    return "\n".join(lines) + "\n"


def table(record: dict) -> str:
    """The results index's table: each schedule's time for one token's products, its GB/s and share of the
    measured read bandwidth; the ceiling; PyTorch's whole generation."""
    out = ["| what | ms per token | GB/s | share of read bandwidth |", "| --- | ---: | ---: | ---: |"]
    for key, name in (("smollm2_q4_products", "SmolLM2-135M, its 210 Q4_1 matrices"),
                      ("tinyllama_shapes_q4_products", "TinyLlama-1.1B's shapes, {layers} layers")):
        part = record[key]
        for label, row in part["schedules"].items():
            out.append(f"| {name.format(**part)}, {label} | {row['median_ms']:.2f} ({row['q1_ms']:.2f}-{row['q3_ms']:.2f}) "
                       f"| {row['gb_per_s']:.1f} | {row['share_of_bandwidth']:.0%} |")
    out += ["", f"Read bandwidth {record['read_bandwidth_gbs']:.1f} GB/s; SmolLM2 reads {record['bytes_per_token'] / 1e6:.1f} MB "
            f"a token: a ceiling of {record['ceiling_tokens_per_s']:.0f} tokens/s.", "",
            "| engine | tokens/s, whole answer | tokens/s after the first | first token, ms | share of the ceiling |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for name, row in record["generation"].items():
        low, high = row["tokens_per_s_range"]
        out.append(f"| {name} | {row['tokens_per_s']:.1f} ({low:.1f}-{high:.1f}) | {row['decode_tokens_per_s']:.1f} "
                   f"| {row['first_token_ms']:.0f} | {row['decode_tokens_per_s'] / record['ceiling_tokens_per_s']:.0%} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    start = time.perf_counter()
    record = measure(args.repeats)
    target = machine.cpu_target()
    path = results_path(target, "json", kind="llm")
    saved = save_record(path, **record)
    path.with_suffix(".md").write_text(markdown(saved))
    print(markdown(saved))
    print(f"written {path} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
