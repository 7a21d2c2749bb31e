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
* PyTorch's whole generation (float32 weights dequantized from the file, its KV cache), tokens/s as a user waits.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import tvm

from .. import int8, llm, machine, qgemv, timing
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


def generation(new_tokens: int, repeats: int) -> dict:
    """PyTorch's greedy answer to ``QUESTION``, timed end to end ``repeats`` times: tokens/s, median and range."""
    model, tok = llm.reference_model(), llm.tokenizer()
    llm.generate_pytorch(model, tok, QUESTION, 4)    # warm-up
    runs = [llm.generate_pytorch(model, tok, QUESTION, new_tokens, new_tokens) for _ in range(repeats)]
    rates = sorted(g.tokens_per_s for g in runs)
    return {"engine": "PyTorch eager, float32 weights", "text": runs[0].text, "new_tokens": runs[0].new_tokens,
            "median_tokens_per_s": float(np.median(rates)), "min": rates[0], "max": rates[-1]}


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
        "pytorch_generation": generation(64, 3),
    }


def markdown(record: dict) -> str:
    """The record as the page a reader opens beside the JSON."""
    lines = [f"# SmolLM2-135M's 4-bit products against the memory roofline: {record['machine']['cpu']}, "
             f"{record['threads']} threads", "", f"Measured {record['measured']} by `python -m helpers.maintainers.llm_roofline`.",
             "", table(record), "", "PyTorch's answer: " + repr(record["pytorch_generation"]["text"])]
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
    gen = record["pytorch_generation"]
    out += ["", f"Read bandwidth {record['read_bandwidth_gbs']:.1f} GB/s; SmolLM2 reads {record['bytes_per_token'] / 1e6:.1f} MB "
            f"a token: a ceiling of {record['ceiling_tokens_per_s']:.0f} tokens/s. {gen['engine']}: "
            f"{gen['median_tokens_per_s']:.1f} tokens/s ({gen['min']:.1f}-{gen['max']:.1f}) over {gen['new_tokens']} tokens."]
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
