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
  file, its KV cache), TVM's step (``helpers.decoder``: the prompt fed 16 tokens a call, ``Decoder.feed``),
  llama.cpp where ``llama-cpp-python`` is installed and OpenVINO GenAI (``generation.openvino_genai_engine``) on
  the same file: tokens/s over the whole answer and after the first token, the prompt's time;
* TVM's step and the two peers on a whole model of TinyLlama-1.1B's shapes (``MODEL_1B``: random weights in the
  same formats, written once to build/models/ by ``shaped_gguf``, 0.7 GB), 32 tokens after a prompt of 30, in rounds;
* the prefill alone on both models: the time to the first token after ``PROMPT_TOKENS`` tokens of real text, TVM
  and the peers in rounds (llama.cpp made to forget the last prompt each round: ``generation.llama_cpp_engine``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from .. import decoder, generation, llm, machine, qgemv
from ..results import results_path, save_record

# TinyLlama-1.1B: width 2048, 22 layers, 32 query and 4 key-value heads of 64, MLP 5632.
SHAPES_1B = {"q": (2048, 2048), "k": (256, 2048), "v": (256, 2048), "o": (2048, 2048), "gate": (5632, 2048),
             "up": (5632, 2048), "down": (2048, 5632)}
LAYERS_1B = 4
# The whole model at TinyLlama-1.1B's shapes, SmolLM2's tokenizer and vocabulary: random weights in the file's
# formats (Q4_1 matrices, the tied embedding in Q8_0), for tokens/s where reading the weights dominates.
MODEL_1B = {"width": 2048, "layers": 22, "heads": 32, "kv_heads": 4, "mlp": 5632}
QUESTION = "Explain what a compiler does."
PROMPT_TOKENS = 128


def shaped_gguf(out: Path, width: int, layers: int, heads: int, kv_heads: int, mlp: int, seed: int = 0) -> Path:
    """A Llama GGUF of the given shape with random weights and SmolLM2's metadata otherwise (its tokenizer, so that
    llama.cpp loads it): what every engine reads at a size the course has no trained model of."""
    import gguf

    source, vocab, head_dim = llm.reader(), llm.shape().vocab, width // heads
    shape_keys = {"llama.embedding_length": width, "llama.block_count": layers, "llama.attention.head_count": heads,
                  "llama.attention.head_count_kv": kv_heads, "llama.feed_forward_length": mlp,
                  "llama.rope.dimension_count": head_dim}
    writer = gguf.GGUFWriter(str(out), "llama")
    for key, field in source.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            array = field.types[0] == gguf.GGUFValueType.ARRAY
            writer.add_key_value(key, shape_keys.get(key, field.contents()), field.types[0],
                                 field.types[1] if array else None)
    rng = np.random.default_rng(seed)

    def matrix(name: str, rows: int, cols: int, kind=gguf.GGMLQuantizationType.Q4_1) -> None:
        weights = rng.normal(0, 0.02, size=(rows, cols)).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(weights, kind), raw_dtype=kind)

    matrix("token_embd.weight", vocab, width, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(width, np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(width, np.float32))
        for name, rows, cols in (("attn_q", width, width), ("attn_k", kv_heads * head_dim, width),
                                 ("attn_v", kv_heads * head_dim, width), ("attn_output", width, width),
                                 ("ffn_gate", mlp, width), ("ffn_up", mlp, width), ("ffn_down", width, mlp)):
            matrix(f"blk.{i}.{name}.weight", rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def peers(ids: list[int], new_tokens: int, path: Path | None = None) -> dict:
    """llama.cpp and OpenVINO GenAI on the same file (None where one is not installed)."""
    return {generation.LLAMA_CPP: generation.llama_cpp_engine(ids, new_tokens, path),
            generation.OPENVINO_GENAI: generation.openvino_genai_engine(ids, new_tokens, path)}


def compared(engines: dict, ids: list[int], repeats: int) -> dict:
    """``generation.compare``'s rows for the engines that exist here (a peer's is None where it is not
    installed), each with the prompt's length."""
    rows = generation.compare({name: run for name, run in engines.items() if run is not None}, repeats)
    return {name: {**row, "prompt_tokens": len(ids)} for name, row in rows.items()}


def prompt_rows(step: decoder.Decoder, path: Path | None, repeats: int) -> dict:
    """The prefill: TVM's ``step`` and the peers on the same file, the time to the first token after
    ``PROMPT_TOKENS`` tokens of real text (``generation.compare``'s rows, two tokens generated)."""
    ids = generation.real_text(PROMPT_TOKENS, llm.tokenizer())
    engines = {generation.TVM: generation.tvm_engine(step, ids, 2), **peers(ids, 2, path)}
    return compared(engines, ids, repeats)


def generation_rows_1b(new_tokens: int, repeats: int) -> dict:
    """TVM's step and the peers on ``MODEL_1B`` (kept in build/models/, made once), a prompt of 30 tokens; and
    their prefill (``prompt_rows``)."""
    path = llm.REPO / "build" / "models" / "tinyllama-shaped-q4_1.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        shaped_gguf(path.with_suffix(".part"), **MODEL_1B).rename(path)
    ids = list(range(100, 130))
    step = decoder.Decoder(decoder.load_weights(path))
    engines = {generation.TVM: generation.tvm_engine(step, ids, new_tokens), **peers(ids, new_tokens, path)}
    return {"model": MODEL_1B, "bytes_per_token": llm.bytes_per_token(path), "engines": compared(engines, ids, repeats),
            "prompt": prompt_rows(step, path, repeats)}


def products(matrices: list[qgemv.Q4Matrix], bandwidth_gbs: float, repeats: int) -> dict:
    """``qgemv.time_products`` of DLight's schedule, the float roofline schedule and the int8 kernel."""
    return qgemv.time_products(matrices, qgemv.schedules(), bandwidth_gbs, repeats)


def generation_rows(step: decoder.Decoder, new_tokens: int, repeats: int) -> dict:
    """Each engine answers ``QUESTION`` greedily (``generation.compare``): PyTorch, TVM's ``step`` and the peers
    that are installed."""
    tok = llm.tokenizer()
    ids = llm.chat_ids(tok, QUESTION)[0].tolist()
    engines = {generation.PYTORCH: generation.pytorch_engine(llm.reference_model(), ids, new_tokens),
               generation.TVM: generation.tvm_engine(step, ids, new_tokens), **peers(ids, new_tokens)}
    return compared(engines, ids, repeats)


def measure(repeats: int = 9) -> dict:
    threads = machine.thread_count()
    torch.set_num_threads(threads)
    bandwidth = qgemv.read_bandwidth_gbs()
    r = llm.reader()
    real = [llm.q4_matrix(t.name) for t in r.tensors if t.tensor_type.name == "Q4_1"]
    rng = np.random.default_rng(0)
    big = [qgemv.quantize(rng.normal(size=s).astype(np.float32)) for _ in range(LAYERS_1B) for s in SHAPES_1B.values()]
    per_token = llm.bytes_per_token()
    step = decoder.Decoder(decoder.load_weights())   # SmolLM2's, for its whole answers and its prompt
    return {
        "machine": {"cpu": machine.cpu_name(), "cores": threads}, "threads": threads,
        "read_bandwidth_gbs": bandwidth, "bytes_per_token": per_token,
        "float32_bytes_per_token": llm.float32_bytes_per_token(),
        "ceiling_tokens_per_s": llm.ceiling_tokens_per_s(per_token, bandwidth),
        "smollm2_q4_products": products(real, bandwidth, repeats),
        "tinyllama_shapes_q4_products": {"layers": LAYERS_1B, **products(big, bandwidth, repeats)},
        "generation": generation_rows(step, 64, 5),
        "prompt": prompt_rows(step, None, 5),
        "generation_1b": generation_rows_1b(32, 3),
    }


def markdown(record: dict) -> str:
    """The record as the page a reader opens beside the JSON."""
    lines = [f"# SmolLM2-135M's 4-bit products against the memory roofline: {record['machine']['cpu']}, "
             f"{record['threads']} threads", "", f"Measured {record['measured']} by `python -m helpers.maintainers.llm_roofline`.",
             "", table(record)]
    return "\n".join(lines) + "\n"


def summary(record: dict) -> str:
    """The results index's part: one line on the products, the engines' table (every column in the .md)."""
    share = {label.split(",")[0]: row["share_of_bandwidth"] for label, row in record["smollm2_q4_products"]["schedules"].items()}
    return "\n".join([f"One token's 210 4-bit products, as a share of the read bandwidth "
                      f"({record['read_bandwidth_gbs']:.1f} GB/s): " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()) + ".",
                      "", *engines_table(record), *prompt_line(record.get("prompt"))])


def engines_table(record: dict) -> list[str]:
    """Each engine's whole generation, and its share of the ceiling of the bytes it reads a token."""
    out = ["| engine | tokens/s, whole answer | tokens/s after the first | first token, ms | share of its ceiling |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for name, row in record["generation"].items():
        low, high = row["tokens_per_s_range"]
        read = record["float32_bytes_per_token"] if name == generation.PYTORCH else record["bytes_per_token"]
        ceiling = llm.ceiling_tokens_per_s(read, record["read_bandwidth_gbs"])
        first, last = row["decode_range"]
        out.append(f"| {name} | {row['tokens_per_s']:.1f} ({low:.1f}-{high:.1f}) | {row['decode_tokens_per_s']:.1f} "
                   f"({first:.1f}-{last:.1f}) | {row['first_token_ms']:.0f} | {row['decode_tokens_per_s'] / ceiling:.0%} |")
    return out


def verdicts(engines: dict) -> list[str]:
    """TVM against each other engine, after the first token and over the whole answer, with the rounds' spread."""
    ours = engines.get(generation.TVM)
    return [f"- TVM against {name}: after the first token {generation.verdict(ours, row)}; over the whole answer "
            f"{generation.verdict(ours, row, 'whole')}." for name, row in engines.items()
            if ours and name != generation.TVM]


def model_1b_table(record: dict) -> list[str]:
    """TVM and the peers on the random model of TinyLlama-1.1B's shapes: tokens/s and the share of the ceiling."""
    part = record.get("generation_1b")
    if not part:
        return []
    shape, ceiling = part["model"], llm.ceiling_tokens_per_s(part["bytes_per_token"], record["read_bandwidth_gbs"])
    out = [f"The whole model at TinyLlama-1.1B's shapes (width {shape['width']}, {shape['layers']} layers, "
           f"{shape['heads']}/{shape['kv_heads']} heads, MLP {shape['mlp']}; random weights, SmolLM2's tokenizer): "
           f"{part['bytes_per_token'] / 1e6:.0f} MB a token, a ceiling of {ceiling:.0f} tokens/s.", "",
           "| engine | tokens/s after the first | first token, ms | share of the ceiling |", "| --- | ---: | ---: | ---: |"]
    for name, row in part["engines"].items():
        first, last = row["decode_range"]
        out.append(f"| {name} | {row['decode_tokens_per_s']:.1f} ({first:.1f}-{last:.1f}) | {row['first_token_ms']:.0f} "
                   f"| {row['decode_tokens_per_s'] / ceiling:.0%} |")
    return out + [""] + verdicts(part["engines"]) + prompt_table(part.get("prompt"))


def prompt_line(rows: dict | None) -> list[str]:
    """``prompt_table`` in one sentence, for the results index."""
    if not rows:
        return []
    ours = rows.get(generation.TVM)
    times = "; ".join(f"{name} {row['first_token_ms']:.0f} ms ({row['first_token_range_ms'][0]:.0f}-"
                      f"{row['first_token_range_ms'][1]:.0f})" for name, row in rows.items())
    verdicts_ = "; ".join(f"TVM against {name} {generation.verdict(ours, row, 'first')}" for name, row in rows.items()
                          if ours and name != generation.TVM)
    return ["", f"The prompt ({next(iter(rows.values()))['prompt_tokens']} tokens of real text) to the first new "
            f"token: {times}. {verdicts_}."]


def prompt_table(rows: dict | None) -> list[str]:
    """The prefill: each engine's time to the first token after the prompt, and TVM's verdict against the others."""
    if not rows:
        return []
    out = ["", f"The prompt alone: {next(iter(rows.values()))['prompt_tokens']} tokens of real text, the time to the "
           "first new token (median and range of the rounds).", "", "| engine | first token, ms | prompt tokens/s |",
           "| --- | ---: | ---: |"]
    for name, row in rows.items():
        low, high = row["first_token_range_ms"]
        out.append(f"| {name} | {row['first_token_ms']:.0f} ({low:.0f}-{high:.0f}) | "
                   f"{row['prompt_tokens'] / row['first_token_ms'] * 1e3:.0f} |")
    ours = rows.get(generation.TVM)
    return out + [""] + [f"- TVM against {name}, the prompt: {generation.verdict(ours, row, 'first')}."
                         for name, row in rows.items() if ours and name != generation.TVM]


def table(record: dict) -> str:
    """Every column, for the .md beside the JSON: each schedule's time for one token's products, its GB/s and
    share of the measured read bandwidth; the ceiling; each engine's whole generation."""
    out = ["| what | ms per token | GB/s | share of read bandwidth |", "| --- | ---: | ---: | ---: |"]
    for key, name in (("smollm2_q4_products", "SmolLM2-135M, its 210 Q4_1 matrices"),
                      ("tinyllama_shapes_q4_products", "TinyLlama-1.1B's shapes, {layers} layers")):
        part = record[key]
        for label, row in part["schedules"].items():
            out.append(f"| {name.format(**part)}, {label} | {row['median_ms']:.2f} ({row['q1_ms']:.2f}-{row['q3_ms']:.2f}) "
                       f"| {row['gb_per_s']:.1f} | {row['share_of_bandwidth']:.0%} |")
    out += ["", f"Read bandwidth {record['read_bandwidth_gbs']:.1f} GB/s; SmolLM2 reads {record['bytes_per_token'] / 1e6:.1f} MB "
            f"a token: a ceiling of {record['ceiling_tokens_per_s']:.0f} tokens/s.", ""] + engines_table(record) + \
        [""] + verdicts(record["generation"]) + prompt_table(record.get("prompt"))
    if record.get("generation_1b"):
        out += [""] + model_1b_table(record)
    out += ["", "Each engine's ceiling is the read bandwidth over the bytes it reads a token: the float32 model's "
            f"({record['float32_bytes_per_token'] / 1e6:.0f} MB) for PyTorch, the file's for the others."]
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
