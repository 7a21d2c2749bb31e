"""Day 14's paged KV cache: the small GPT in relax.frontend.nn over TVM's TIRPagedKVCache, on the CPU."""

import numpy as np
import pytest
import torch

from helpers import build, databases, greedy_decoding, ir, machine, paged_cache, peers, transformer, tuning
from helpers.errors import CourseError, InputShapeError, ParityError

TARGET = machine.cpu_target()
SMALL = transformer.GPTConfig(vocab=64, width=32, layers=3, heads=2, max_len=48)
ATTENTION = "vm.builtin.attention_kv_cache_attention_with_fused_qkv"


@pytest.fixture(scope="module")
def small():
    return transformer.TinyGPT(SMALL, seed=3)


@pytest.fixture(scope="module")
def paged(small):
    return paged_cache.compile_paged(small, TARGET)


def test_every_layer_attends_through_the_cache_in_both_functions(small):
    mod, weights = paged_cache.export(small, TARGET)
    for function in ("prefill", "decode"):
        found = sum(str(call.args[0].global_symbol) == ATTENTION for call in ir.calls(mod, "call_dps_packed", function))
        assert found == SMALL.layers, f"{function}: {found} attention calls through the cache"
    assert len(weights) == len(small.state_dict())


def test_prefill_matches_pytorch_at_lengths_the_day_does_not_use(small, paged):
    for length in (1, 7, SMALL.max_len):
        ids = transformer.tokens(length, SMALL.vocab, seed=length)
        prefill, _ = paged.steps()
        logits, _ = prefill(ids)
        with torch.inference_mode():
            want = small.prefill(ids)[0].numpy()
        assert logits.shape == want.shape
        assert build.relative_error(logits, want) < 1e-5


def test_greedy_tokens_through_the_paged_cache_are_those_computed_without_a_cache(small, paged):
    prompt = transformer.tokens(9, SMALL.vocab, seed=5)
    want = transformer.tokens_without_cache(small, prompt, 12)
    assert greedy_decoding.generate(*greedy_decoding.paged_loop(paged), prompt, 12) == want


def test_a_repeated_decode_step_pops_its_token_and_matches_eager_beside_the_explicit_cache(small, paged):
    decoder = transformer.compile_decoder(transformer.import_decode(small), TARGET)
    runners = transformer.step_runners(small, {"explicit": decoder, "paged": paged}, past=20)  # checked inside
    first, second = runners["paged"]().numpy(), runners["paged"]().numpy()
    np.testing.assert_array_equal(first, second)  # the same past each time: the step's token was popped


def test_a_paged_model_with_other_weights_fails_the_check_against_eager(small):
    other = paged_cache.compile_paged(transformer.TinyGPT(SMALL, seed=4), TARGET)
    with pytest.raises(ParityError, match="differ from PyTorch eager"):
        transformer.step_runners(small, {"paged, other weights": other}, past=10)


def test_the_cache_refuses_more_tokens_than_it_holds(paged):
    prefill, decode = paged.steps()
    _, cache = prefill(transformer.tokens(SMALL.max_len - 1, SMALL.vocab))
    decode(3, SMALL.max_len - 1, cache)  # the last position fits
    with pytest.raises(InputShapeError, match=f"holds {SMALL.max_len} positions"):
        decode(3, SMALL.max_len, cache)


def test_weights_the_pytorch_model_lacks_are_named():
    class Wider(transformer.TinyGPT):
        def state_dict(self, *args, **kwargs):
            return {k: v for k, v in super().state_dict(*args, **kwargs).items() if k != "ln.bias"}

    with pytest.raises(CourseError, match="ln.bias"):
        paged_cache.export(Wider(SMALL), TARGET)


def test_the_shipped_paged_database_covers_every_static_kernel_and_its_build_decodes_like_pytorch():
    """Day 14 builds the paged step with it: a change to the paged model must come with a new database."""
    model = transformer.TinyGPT()
    mod, _ = paged_cache.paged_module(model, TARGET)
    tasks = tuning.extract_tasks(tuning.prepare(mod, TARGET, prepack=False), TARGET)
    static = {t.task_name for t in tasks if tuning.is_static(t.dispatched[0])}
    assert any("NT_matmul" in name for name in static), "the decoding step's matmuls on one token are static"
    shipped = sorted(databases.SHIPPED_ROOT.glob(f"{paged_cache.DATABASE_NAME}-b1-*cores"))
    assert shipped, "no database for the paged step ships in tuning/: python -m helpers.maintainers.shipping paged"
    lookups = {name for name in static if name.startswith("take")}  # embedding lookups: not tunable (see test_transformer)
    for path in shipped:
        db = tuning.load_database(path)
        missing = {t.task_name for t in tasks if t.task_name in static and not db.has_workload(t.dispatched[0])} - lookups
        assert not missing, f"{path.name} has no record for {sorted(missing)[:4]} ({len(missing)} of {len(static)})"
    database = databases.choose(paged_cache.DATABASE_NAME, None, TARGET, tune_if_missing=False)
    tuned = paged_cache.compile_paged(model, TARGET, database=database)
    transformer.step_runners(model, {paged_cache.TUNED_LABEL: tuned}, past=12)  # checked against eager inside
