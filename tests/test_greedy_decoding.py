"""Day 14's whole generations: the next token chosen inside each engine's step, every engine checked on the
tokens before it is timed."""

import numpy as np
import pytest
import tvm

from helpers import build, greedy_decoding, machine, peers, transformer
from helpers.errors import ParityError

TARGET = machine.cpu_target()
SMALL = transformer.GPTConfig(vocab=64, width=32, layers=2, heads=2, max_len=48)
PROMPT_LENGTH, COUNT = 6, 10


@pytest.fixture(scope="module")
def small():
    return transformer.TinyGPT(SMALL, seed=1)


@pytest.fixture(scope="module")
def builds(small):
    """A bucket of the prompt's length, the greedy step and the plain step, untuned."""
    bucket = transformer.bind_length(transformer.import_prefill(small), PROMPT_LENGTH)
    return (build.compile_model(bucket, TARGET),
            greedy_decoding.compile_greedy_decode(greedy_decoding.import_greedy_decode(small), TARGET),
            transformer.compile_decoder(transformer.import_decode(small), TARGET))


def test_every_engine_generates_the_tokens_computed_without_a_cache(small, builds):
    prompt = transformer.tokens(PROMPT_LENGTH, SMALL.vocab, seed=4)
    runners, missing = greedy_decoding.runners(small, *builds, prompt, COUNT, which=(peers.ORT, peers.OPENVINO))
    assert not missing, missing
    assert set(runners) == {peers.EAGER, greedy_decoding.TVM, greedy_decoding.TVM_NUMPY, peers.ORT, peers.OPENVINO}
    want = transformer.tokens_without_cache(small, prompt, COUNT)
    for label, run in runners.items():
        assert run() == want, label


def test_tvm_s_greedy_step_hands_the_next_step_device_tensors_one_position_on(builds):
    prefill, greedy, _ = builds
    start, step = greedy_decoding.tvm_loop(prefill, greedy)
    state = start(transformer.tokens(PROMPT_LENGTH, SMALL.vocab, seed=5).numpy())
    after = step(*state)
    assert all(isinstance(t, tvm.runtime.Tensor) for t in after)
    assert after[1].numpy().tolist() == [[PROMPT_LENGTH + 1]]
    assert after[2].shape[3] == PROMPT_LENGTH + 1, "the cache one position longer"
    assert 0 <= int(after[0].numpy()[0, 0]) < SMALL.vocab


def test_an_engine_choosing_other_tokens_is_refused_before_it_is_timed(small, builds):
    prefill, _, decoder = builds
    other = transformer.TinyGPT(SMALL, seed=2)  # another model's greedy step: other tokens
    wrong = greedy_decoding.compile_greedy_decode(greedy_decoding.import_greedy_decode(other), TARGET)
    prompt = transformer.tokens(PROMPT_LENGTH, SMALL.vocab, seed=4)
    with pytest.raises(ParityError, match="chose other tokens than PyTorch eager"):
        greedy_decoding.runners(small, prefill, wrong, decoder, prompt, COUNT, which=())


def test_generate_reads_tokens_of_every_kind_an_engine_returns():
    tokens = iter([np.array([[3]]), tvm.runtime.tensor(np.array([[4]], dtype="int64")), 5])

    def start(ids):
        return (next(tokens), ids.shape[1])

    def step(token, position):
        return (next(tokens), position + 1)

    assert greedy_decoding.generate(start, step, np.zeros((1, 2)), 3) == [3, 4, 5]
