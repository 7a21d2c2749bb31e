"""Day 14's transformer helpers: a symbolic length, buckets, an explicit KV cache, generation."""

import numpy as np
import pytest
import torch
from tvm import relax

from helpers import build, databases, ir, machine, peers, transformer, tuning
from helpers.errors import CourseError, InputShapeError, ParityError

TARGET = machine.cpu_target()
SMALL = transformer.GPTConfig(vocab=64, width=32, layers=2, heads=2, max_len=48)


@pytest.fixture(scope="module")
def small():
    return transformer.TinyGPT(SMALL, seed=1)


@pytest.fixture(scope="module")
def symbolic(small):
    imported = transformer.import_prefill(small)
    return imported, transformer.compile_symbolic(imported, TARGET)


def _prefill_outputs(model, ids):
    with torch.inference_mode():
        return [t.numpy() for t in model.prefill(ids)]


def test_one_symbolic_build_matches_pytorch_at_every_length_of_its_range(small, symbolic):
    imported, compiled = symbolic
    (name, bounds), = transformer.length_bounds(imported.mod).items()
    assert bounds == (2, SMALL.max_len) and compiled.bounds == bounds
    for length in (2, 5, 31, SMALL.max_len):
        ids = transformer.tokens(length, SMALL.vocab, seed=length)
        got = transformer.outputs(compiled.run_on_device(compiled.to_device(ids)))
        assert [g.shape for g in got] == [w.shape for w in _prefill_outputs(small, ids)]
        assert max(build.relative_error(g, w) for g, w in zip(got, _prefill_outputs(small, ids))) < 1e-5


def test_the_symbolic_build_refuses_lengths_and_dtypes_outside_its_signature(symbolic):
    _, compiled = symbolic
    for bad in (transformer.tokens(SMALL.max_len + 1, SMALL.vocab), transformer.tokens(1, SMALL.vocab),
                transformer.tokens(8, SMALL.vocab).int(), torch.zeros(2, 8, dtype=torch.int64)):
        with pytest.raises(InputShapeError, match=r"\(1, length\) int64"):
            compiled.to_device(bad)


def test_a_bucket_is_static_and_matches_pytorch(small, symbolic):
    imported, _ = symbolic
    bucket = transformer.bind_length(imported, 16)
    assert transformer.length_bounds(bucket.mod) == {} and bucket.input_shape == (1, 16)
    compiled = build.compile_model(bucket, TARGET)
    ids = transformer.tokens(16, SMALL.vocab, seed=3)
    got = transformer.outputs(compiled.run_on_device(compiled.to_device(ids)))
    assert build.relative_error(got[0], _prefill_outputs(small, ids)[0]) < 1e-5
    with pytest.raises(InputShapeError, match="compiled for input"):
        compiled.to_device(transformer.tokens(17, SMALL.vocab))


def test_bind_length_refuses_a_size_outside_the_range_and_a_static_module(symbolic):
    imported, _ = symbolic
    with pytest.raises(InputShapeError, match="outside the range .*2 to 48"):
        transformer.bind_length(imported, 49)
    with pytest.raises(CourseError, match="one symbolic length"):
        transformer.bind_length(transformer.bind_length(imported, 16), 16)


def test_tuning_refuses_a_symbolic_kernel_before_touching_the_database(symbolic, tmp_path):
    imported, _ = symbolic
    work_dir = tmp_path / "db"
    with pytest.raises(CourseError, match=r"symbolic dimensions \(s\d+\).*BindSymbolicVars"):
        tuning.tune(imported.mod, TARGET, work_dir, max_trials_per_task=1)
    assert not work_dir.exists()


def test_attention_stays_one_operator_only_without_decomposition(small):
    kept = ir.op_histogram(transformer.import_prefill(small, 8, decompose=False).mod)
    decomposed = ir.op_histogram(transformer.import_prefill(small, 8).mod)
    assert kept["nn.attention"] == SMALL.layers
    assert "nn.attention" not in decomposed and decomposed["nn.softmax"] == SMALL.layers


def test_kept_attention_is_one_kernel_whose_blocks_are_matmul_mask_softmax_matmul(small):
    fused = build.fuse(transformer.import_prefill(small, 8, decompose=False).mod, TARGET)
    steps = ir.block_names(fused, "attention")
    first_matmul, mask, second_matmul = (steps.index(name) for name in ("T_batch_matmul_NT", "trilu", "T_batch_matmul_NN"))
    assert first_matmul < mask < second_matmul and "root" not in steps
    with pytest.raises(CourseError, match="no TensorIR kernel 'main'"):
        ir.block_names(fused, "main")


def test_decoding_with_the_explicit_cache_gives_the_tokens_computed_without_one(small, symbolic):
    _, prefill = symbolic
    decode = transformer.import_decode(small)
    (name, bounds), = transformer.length_bounds(decode.mod).items()
    assert bounds == (1, SMALL.max_len - 1)
    decoder = transformer.compile_decoder(decode, TARGET)
    prompt = transformer.tokens(6, SMALL.vocab, seed=4)
    want = transformer.tokens_without_cache(small, prompt, 10)
    for prefill_step, decode_step in (transformer.torch_steps(small), transformer.tvm_steps(prefill, decoder)):
        logits, cache = prefill_step(prompt)
        found = [int(logits[0, -1].argmax())]
        for position in range(6, 15):
            logits, cache = decode_step(found[-1], position, cache)
            found.append(int(logits[0, -1].argmax()))
        assert found == want


def test_grouped_query_attention_is_attention_with_each_key_value_head_repeated_for_its_query_heads():
    grouped = transformer.GPTConfig(vocab=64, width=32, layers=2, heads=4, kv_heads=2, max_len=48)
    model = transformer.TinyGPT(grouped, seed=2)
    repeated = transformer.TinyGPT(transformer.GPTConfig(vocab=64, width=32, layers=2, heads=4, max_len=48), seed=9)
    weights, hd, group = model.state_dict(), grouped.head_dim, grouped.heads // grouped.kv_heads
    for name, tensor in weights.items():
        if ".qkv." in name:  # every query head, then the key heads, then the value heads: each of k and v repeated
            q, k, v = tensor.split([grouped.width, grouped.kv_heads * hd, grouped.kv_heads * hd])
            k, v = (t.reshape(grouped.kv_heads, hd, *t.shape[1:]).repeat_interleave(group, 0).reshape(-1, *t.shape[1:])
                    for t in (k, v))
            tensor = torch.cat([q, k, v])
        repeated.state_dict()[name].copy_(tensor)
    prompt = transformer.tokens(7, 64, seed=3)
    with torch.inference_mode():
        logits, keys, values = model.prefill(prompt)
        assert keys.shape == values.shape == (2, 1, grouped.kv_heads, 7, hd)  # the cache holds the shared heads only
        assert build.relative_error(logits.numpy(), repeated.prefill(prompt)[0].numpy()) < 1e-5
    prefill, decode = transformer.torch_steps(model)
    logits, cache = prefill(prompt)
    found = [int(logits[0, -1].argmax())]
    for position in range(7, 12):
        logits, cache = decode(found[-1], position, cache)
        found.append(int(logits[0, -1].argmax()))
    assert found == transformer.tokens_without_cache(model, prompt, 6) == transformer.tokens_without_cache(repeated, prompt, 6)
    with pytest.raises(ValueError, match="must divide heads=4"):
        transformer.GPTConfig(heads=4, kv_heads=3)


def test_the_model_is_seeded_and_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = transformer.TinyGPT(SMALL, seed=5), transformer.TinyGPT(SMALL, seed=5)
    assert torch.equal(torch.rand(1), before)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.head.weight, transformer.TinyGPT(SMALL, seed=6).head.weight)


def test_peers_compare_a_model_with_several_outputs_by_its_first(small):
    found = peers.peers(transformer.Prefill(small), transformer.tokens(8, SMALL.vocab), which=(peers.EAGER, peers.ORT))
    assert set(found.runners) == {peers.EAGER, peers.ORT}, found.missing


@pytest.mark.parametrize("length", transformer.BUCKETS)
def test_each_shipped_bucket_database_covers_every_kernel_of_its_bucket(length):
    """Day 14 and make benchmark build with them: a change to the model or the import must come with new databases."""
    bucket = transformer.bind_length(transformer.import_prefill(transformer.TinyGPT()), length)
    # What tune tunes: the kernels a call runs (a prepacked build's weight rewrites run once, at load, untuned).
    tasks = tuning.tunable_tasks(bucket.mod, TARGET, prepack=True)
    shipped = sorted(databases.SHIPPED_ROOT.glob(f"{transformer.bucket_name(length)}-b1-*cores"))
    assert shipped, f"no database for the {length}-token bucket ships in tuning/: python -m helpers.maintainers.shipping prefill --length {length}"
    # The token embedding's lookup (take) cannot be tuned: MetaSchedule times candidates on random inputs, and
    # random token ids outside the table crash its runner ("Fast mode segfaults when there are out-of-bounds
    # indices"). It keeps its default schedule. (The positions' lookup reads constants only: it runs at load.)
    lookups = {t.task_name for t in tasks if t.task_name.startswith("take")}
    assert len(lookups) == 1
    for path in shipped:
        db = tuning.load_database(path)
        missing = {t.task_name for t in tasks if not db.has_workload(t.dispatched[0])} - lookups
        assert not missing, f"{path.name} has no record for {sorted(missing)[:4]} ({len(missing)} of {len(tasks)})"


def test_the_shipped_decode_database_covers_every_static_kernel_of_the_step():
    decode = transformer.import_decode(transformer.TinyGPT())
    tasks = tuning.extract_tasks(tuning.prepare(decode.mod, TARGET, prepack=False), TARGET)
    static = {t.task_name for t in tasks if tuning.is_static(t.dispatched[0])}
    assert 0 < len(static) < len(tasks), "the step has static kernels (one token's matmuls) and symbolic ones (the past)"
    shipped = sorted(databases.SHIPPED_ROOT.glob(f"{transformer.DECODE_NAME}-b1-*cores"))
    assert shipped, "no database for Day 14's decoding step ships in tuning/: python -m helpers.maintainers.shipping decode"
    for path in shipped:
        db = tuning.load_database(path)
        covered = {t.task_name for t in tasks if db.has_workload(t.dispatched[0])}
        assert covered <= static, f"{path.name} has records for symbolic kernels: {sorted(covered - static)}"
        missing = {name for name in static - covered if not name.startswith("take")}  # lookups: see the bucket's test
        assert not missing, f"{path.name} has no record for {sorted(missing)[:4]}"


def test_tuning_only_the_static_kernels_of_a_symbolic_step_keeps_its_tokens(small, symbolic, tmp_path):
    _, prefill = symbolic
    decode = transformer.import_decode(small)
    with pytest.raises(CourseError, match="prepack=True on a module with symbolic dimensions"):
        tuning.tune(decode.mod, TARGET, tmp_path / "db", max_trials_per_task=1, prepack=True, static_kernels_only=True)
    tuning.tune(decode.mod, TARGET, tmp_path / "db", max_trials_per_task=1, max_trials_global=6, static_kernels_only=True,
                progress=False)  # a few kernels tuned: the rest keep default code, as the symbolic ones do
    tasks = tuning.extract_tasks(tuning.prepare(decode.mod, TARGET, prepack=False), TARGET)
    db = tuning.load_database(tmp_path / "db")
    assert all(tuning.is_static(t.dispatched[0]) for t in tasks if db.has_workload(t.dispatched[0]))
    # each Linear's weight transposed for its matmul reads weights only: lifted, it runs once at load
    plain = tuning.apply_database(decode.mod, TARGET, tmp_path / "db")
    lifted = tuning.apply_database(decode.mod, TARGET, tmp_path / "db", lift=True)
    assert _weight_only_calls(plain) >= SMALL.layers and _weight_only_calls(lifted) == 0
    assert "main_transform_params" in {g.name_hint for g in lifted.get_global_vars()}
    compiled = tuning.compile_tuned(decode, TARGET, tmp_path / "db")  # lifts, and runs the lifted part once
    decoder = transformer.Decoder(compiled)
    prompt = transformer.tokens(5, SMALL.vocab, seed=6)
    prefill_step, decode_step = transformer.tvm_steps(prefill, decoder)
    logits, cache = prefill_step(prompt)
    found = [int(logits[0, -1].argmax())]
    for position in range(5, 11):
        logits, cache = decode_step(found[-1], position, cache)
        found.append(int(logits[0, -1].argmax()))
    assert found == transformer.tokens_without_cache(small, prompt, 7)


def _weight_only_calls(mod) -> int:
    """How many kernels ``main`` calls on weights alone (its parameters after ``num_input``)."""
    main = mod["main"]
    weights = set(main.params[int(main.attrs["num_input"]):])
    return sum(all(arg in weights for arg in call.args[1].fields) for call in ir.calls(mod, "call_tir")
               if call.args[1].fields)


def test_the_decode_steps_peers_run_the_step_and_are_checked_against_eager(small):
    """ONNX Runtime and OpenVINO on one export of the step with a dynamic past (Day 14's full-size table; its
    quick run leaves the peers out): built in the course's set-ups and checked on logits and cache before
    they are timed; a peer that computes something else is refused."""
    runners, missing = transformer.decode_peers(small, past=8, which=(peers.ORT, peers.OPENVINO))
    assert not missing, missing
    assert set(runners) == {peers.EAGER, peers.ORT, peers.OPENVINO}
    for label in (peers.ORT, peers.OPENVINO):
        assert np.asarray(runners[label]()[1]).shape[3] == 9, f"{label}: the cache one position longer than the past"
    logits, keys, values = runners[peers.ORT]()
    with pytest.raises(ParityError, match="differ from PyTorch eager"):
        peers.check_outputs("a wrong peer", [np.asarray(logits) + 1, keys, values],
                            [np.asarray(logits), keys, values], transformer.STEP_OUTPUTS)
    with pytest.raises(ParityError, match="its keys have shape"):
        peers.check_outputs("a short cache", [logits, np.asarray(keys)[..., :-1, :], values],
                            [np.asarray(logits), np.asarray(keys), np.asarray(values)], transformer.STEP_OUTPUTS)


def test_compile_with_passes_runs_lifted_weight_work_once_on_a_bucket_and_a_symbolic_build(small, symbolic):
    imported, _ = symbolic
    bucket = transformer.bind_length(imported, 16)
    ids = transformer.tokens(16, SMALL.vocab, seed=4)
    want = _prefill_outputs(small, ids)[0]
    lift = [relax.transform.LiftTransformParams()]
    for label, module in [("bucket", bucket), ("symbolic", imported)]:
        plain = transformer.compile_with_passes(module, TARGET, [])
        lifted = transformer.compile_with_passes(module, TARGET, lift)
        shapes = [[tuple(p.shape) for p in compiled.params] for compiled in (plain, lifted)]
        assert shapes[0] != shapes[1], f"{label}: the lifted build's weights were not transformed (transposed)"
        for compiled in (plain, lifted):
            got = transformer.outputs(compiled.run_on_device(compiled.to_device(ids)))
            assert build.relative_error(got[0], want) < 1e-5, label
