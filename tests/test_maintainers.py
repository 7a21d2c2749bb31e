"""Each maintainers' command (helpers.maintainers) on a tiny model and the smallest budget: its code path, its output.

The commands measure the course's models at full size for results/ and tuning/; here a model of a few
layers stands in for every course model (``models.load_imported``), one trial per task is the budget,
the databases and results go to a scratch folder, and every timing has two repeats. What is checked
is what each command writes and prints, not how fast anything is. Where a command needs a database
for a model the tiny one's does not fit (Day 12's int8 model, Day 14's GPT), ``Untuned`` stands in.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from tvm.s_tir import meta_schedule as ms

from helpers import (accuracy, amx, build, databases, digits, dispatch, kernels, machine, models, paged_cache, peers, quantize,
                     results, transformer, tuning)
from helpers.maintainers import (benchmark, capstone, gemv, int8_table, shipping, stages, table, transfer_study, transformer_large,
                                 transformer_table)

TARGET = machine.cpu_target()
GPT = transformer.TinyGPT  # the class itself: tests swap the default model for a small one
SMALL_GPT = transformer.GPTConfig(vocab=32, width=16, layers=1, heads=2, max_len=32)


def _tiny_model() -> torch.nn.Module:
    """Only torch's layers (the suite's caches key such a model's imports and exports by its weights)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 16, 1)).eval()


def _kept(kind: str) -> dict:
    return json.loads(results.results_path(TARGET, "json", kind=kind).read_text())


def _copying_tune(monkeypatch, database) -> list:
    """``tuning.tune`` replaced by a copy of ``database`` into the directory asked for; returns the calls' arguments."""
    calls = []

    def tune(mod, target, work_dir, max_trials_per_task, **options):
        calls.append((Path(work_dir), max_trials_per_task, options))
        shutil.copytree(database, work_dir, dirs_exist_ok=True)
        return Path(work_dir)

    monkeypatch.setattr(tuning, "tune", tune)
    return calls


class Untuned:
    """A database stand-in for a model the tiny database has no kernels of: TVM's default schedules."""

    trials_per_task = None

    def compile(self, imported, target, layout=None):
        return build.compile_model(imported, target)

    def label(self):
        return "untuned stand-in"


@pytest.fixture(scope="module")
def tiny():
    model = _tiny_model()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return model, x, models.import_to_relax(model, x)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("maintainers")


@pytest.fixture
def course(monkeypatch, tiny, scratch):
    """Every course model is the tiny one; databases and results live in the scratch folder."""
    monkeypatch.setattr(models, "load_imported", lambda name, batch=1: tiny)
    for name in ("SHIPPED_ROOT", "OWN_ROOT", "QUICK_ROOT"):
        monkeypatch.setattr(databases, name, scratch / "tuning" / name.lower())
    monkeypatch.setattr(results, "RESULTS_ROOT", scratch / "results")
    monkeypatch.setattr(transfer_study, "STUDY_ROOT", scratch / "transfer-study")
    monkeypatch.setattr(peers, "default_peers", lambda: (peers.EAGER,))  # ONNX Runtime's export costs seconds
    return scratch


@pytest.fixture(scope="module")
def schedules(tiny, tmp_path_factory):
    """A real database of the tiny model's kernels (prepacked), each with TVM's default schedule (an empty trace)
    and a made-up time: what one trial per task can leave, without the minutes of a search (``tuning.tune`` is
    tested in test_tuning.py)."""
    work_dir = tmp_path_factory.mktemp("schedules")
    tasks = tuning.extract_tasks(tuning.per_call_kernels(tuning.prepare(tiny[2].mod, TARGET, prepack=True)), TARGET)
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    for task in tasks:
        kernel = task.dispatched[0]
        db.commit_tuning_record(ms.database.TuningRecord(
            tvm.s_tir.Schedule(kernel).trace, db.commit_workload(kernel), [1e-5], TARGET,
            ms.arg_info.ArgInfo.from_prim_func(kernel["main"])))
    tuning.settings.write_settings(work_dir, prepack=True, trials_per_task=1)
    return work_dir


@pytest.fixture(scope="module")
def tuned(tiny, scratch, schedules):
    """``tune_in_stages`` of the tiny model, one stage of one trial per task, shipped (pruned): the database the
    other commands build with. Its tuning leaves ``schedules``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "load_imported", lambda name, batch=1: tiny)
        tunings = _copying_tune(patch, schedules)
        work_dir = stages.tune_in_stages("tiny", [1], work_dir=scratch / "tuning" / "shipped_root" / databases.database_dir(
            "mobilenet_v2", TARGET).name, repeats=2, keep=1)
    assert [(trials, options["prepack"]) for _, trials, options in tunings] == [(1, True)]
    return work_dir


def test_tuning_in_stages_writes_the_curve_and_ships_a_pruned_database(tuned):
    curve = results.read_curve(tuned)
    assert curve["model"] == "tiny" and curve["shipped_records_per_kernel"] == 1
    (point,) = curve["points"]
    assert point["trials_per_task"] == 1 and point["eager_ms"] > 0 and point["tuned_ms"] > 0
    summary = tuning.database_summary(tuned)
    assert summary["records"] == summary["workloads"] > 0, "one record per kernel after shipping"
    assert tuning.budget(tuned) == 1 and tuning.tuned_with_prepacking(tuned)


def test_the_table_command_measures_every_engine_and_keeps_the_table(course, tuned, monkeypatch, capsys):
    """The dispatch run goes in this process here (its own process is tested below); the kernels its build leaves
    in TVM keep their default code: the tiny database has none of them (a course model's database has)."""
    dispatched, compile_dispatched = [], dispatch.compile_dispatched
    monkeypatch.setattr(table, "_dispatch_run_in_its_own_process",
                        lambda *args: dispatched.append(args) or table.dispatch_run(*args[:3], mcpu=None))
    monkeypatch.setattr(dispatch, "compile_dispatched", lambda imported, target, database, **rewrite: compile_dispatched(
        imported, target, **rewrite))
    assert benchmark.main(["table", "mobilenet_v2", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    (row,) = _kept("benchmark")["rows"]
    assert {peers.EAGER, peers.UNTUNED, peers.TUNED, table.DISPATCHED} <= set(row) and row["trials_per_task"] == 1
    for label, error in row["lower_precision"].items():  # OpenVINO's default where it is not float32 (bf16 here)
        assert label in row and 0 < error < 0.05 and f"error {error:.1e}" in out
    assert dispatched and dispatched[0][:3] == ("mobilenet_v2", 1, 2)
    assert "| mobilenet_v2 | 1 |" in out and "saved" in out


def test_the_dispatch_run_starts_a_process_whose_pool_does_not_spin(monkeypatch):
    seen = {}

    def run(command, **options):
        seen.update(command=command, env=options["env"])
        return type("Done", (), {"returncode": 0, "stdout": 'noise\n{"x": {"median_ms": 1.0}}\n', "stderr": ""})()

    monkeypatch.setattr(table.subprocess, "run", run)
    assert table._dispatch_run_in_its_own_process("resnet50", 1, 3, TARGET) == {"x": {"median_ms": 1.0}}
    assert seen["command"][1:4] == ["-m", "helpers.maintainers.benchmark", "dispatch-run"]
    assert seen["env"][table.SPIN_ENV] == "0"


def test_comparing_databases_and_layers_name_each_database(course, tuned, capsys):
    assert benchmark.main(["compare", "mobilenet_v2", str(tuned), "--repeats", "2"]) == 0
    assert table.database_label(tuned) in capsys.readouterr().out
    assert benchmark.main(["layers", "mobilenet_v2", "--repeats", "2"]) == 0
    kept = _kept("layers-mobilenet_v2")
    assert kept["layers against torch.compile (freezing)"] and kept["layers against ONNX Runtime"] and kept["layers against OpenVINO"]
    assert "where TVM loses most" in capsys.readouterr().out


def test_the_transfer_study_times_every_arm_and_keeps_the_record(course, tuned, retarget, monkeypatch):
    """The tiny database, stamped as tuned on another CPU, is the one transferred. Tuning from it (seeded) and from
    scratch is ``tuning.tune``'s, tested with ``tune_in_stages`` above and in test_tuning.py: here it leaves a copy."""
    elsewhere = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": TARGET.attrs["num-cores"]})
    foreign = databases.database_dir("mobilenet_v2", elsewhere, root=databases.OWN_ROOT)
    retarget(tuned, foreign, elsewhere)
    tunings = _copying_tune(monkeypatch, tuned)
    record = transfer_study.run_study("mobilenet_v2", top_up=1, scratch=[1, 2], repeats=2)
    assert [r["arm"] for r in record["rows"]] == [peers.EAGER, "untuned", "transferred", "transferred + 1 trials/task",
                                                  "from scratch, 1 trials/task", "from scratch, 2 trials/task"]
    assert [(work_dir.name, trials) for work_dir, trials, _ in tunings] == [("top-up", 1), ("scratch", 1), ("scratch", 1)]
    assert tunings[0][2]["seed_from"] == foreign and all(options["prepack"] for *_, options in tunings)
    assert record["imitated"] is None and record["source"]["tuned_for"] == f"skylake-avx512, {TARGET.attrs['num-cores']} cores"
    assert _kept("transfer-mobilenet_v2")["rows"] == record["rows"]


def test_the_int8_comparison_times_both_precisions_and_keeps_their_errors_and_accuracy(course, monkeypatch, capsys):
    model, quantized = _int8_model()
    monkeypatch.setattr(quantize, "quantized_model", lambda target=None: (model, quantized, {}))
    monkeypatch.setattr(quantize, "torch_int8", lambda float_model, _inputs: torch.inference_mode()(float_model))  # no PT2E
    monkeypatch.setattr(models, "example_input", lambda batch=1, seed=0: torch.randn(
        1, 3, 12, 12, generator=torch.Generator().manual_seed(seed)))
    monkeypatch.setattr(databases, "choose", lambda *args, **kwargs: Untuned())
    labels = digits.test_set(20)[1].numpy()  # the digits' builds are tested by Day 12 itself: one wrong answer each here
    wrong = labels.copy()
    wrong[0] = (wrong[0] + 1) % 10
    builds = ["PyTorch fp32", "PyTorch int8", "ONNX Runtime int8", "OpenVINO int8", "TVM int8"]
    monkeypatch.setattr(int8_table, "digits_accuracy", lambda target: accuracy.table(
        {b: labels if b == "PyTorch fp32" else wrong for b in builds}, labels, "PyTorch fp32").to_dict("records"))
    assert benchmark.main(["int8", "--repeats", "2"]) == 0
    kept = _kept("int8")
    without_tiles = [int8_table.TVM_INT8_NO_TILES] if amx.has_amx(TARGET, amx.INT8) else []  # what AMX buys, in one run
    assert [r["backend"] for r in kept["rows"]] == ["PyTorch fp32", "PyTorch int8", "ONNX Runtime int8", "OpenVINO int8",
                                                    "TVM fp32 tuned", "TVM int8 tuned", *without_tiles]
    assert kept["tiles"] == bool(without_tiles)
    assert kept["errors"]["TVM int8 tuned"] < 1 and kept["held_out_images"] == int8_table.INT8_IMAGES
    assert set(kept["errors"]) == {"PyTorch int8", "ONNX Runtime int8", "OpenVINO int8", "TVM int8 tuned", *without_tiles}
    top1 = {r["backend"]: r["top1"] for r in kept["rows"]}
    assert top1["TVM fp32 tuned"] == 1.0 and top1["TVM int8 tuned"] == top1["PyTorch int8"] == 19 / 20
    assert all(r["top1_low"] < r["top1"] <= r["top1_high"] for r in kept["rows"]) and kept["missing"] == {}
    out = capsys.readouterr().out
    assert "| TVM int8 tuned |" in out and "95.0 % (" in out and "TVM int8: 1" in out


def test_the_transformer_comparison_times_each_bucket_and_the_decoding_step(course, monkeypatch):
    """A one-layer GPT. Each build costs seconds: the decoding step is built once and stands in for its tuned
    build and for the paged cache's (tested in test_paged_cache.py); torch.compile(dynamic=True) is eager here."""
    monkeypatch.setattr(transformer, "TinyGPT", lambda: GPT(SMALL_GPT, seed=1))
    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    built, compile_decoder = [], transformer.compile_decoder
    monkeypatch.setattr(transformer, "compile_decoder", lambda imported, target=None, database=None: built[0] if built
                        else built.append(compile_decoder(imported, target)) or built[0])
    monkeypatch.setattr(paged_cache, "compile_paged", lambda model, target=None, database=None: built[0])
    monkeypatch.setattr(transformer, "BUCKETS", (16,))
    monkeypatch.setattr(transformer, "BUCKET", 16)
    monkeypatch.setattr(databases, "choose", lambda *args, **kwargs: Untuned())
    result = transformer_table.transformer_run(repeats=2)
    (prefill,) = result["prefill"]
    assert prefill["length"] == 16 and transformer.TUNED_BUCKET in prefill["engines"]
    assert {transformer.DECODE_TVM, transformer.DECODE_TUNED, paged_cache.LABEL, paged_cache.TUNED_LABEL, peers.EAGER,
            peers.COMPILED, peers.ORT, peers.OPENVINO} <= set(result["decode"]) and result["decode_missing"] == {}
    text = transformer_table.format_transformer(result, "a test machine")
    assert "| prefill, 16 tokens |" in text and "| decode after 16 |" in text and "Decoding after 16:" in text


def test_the_large_transformer_comparison_gives_tokens_per_second_and_the_memory_floor(monkeypatch):
    """The same code at a tiny size; torch.compile(dynamic=True) is eager here (its compile costs a minute)."""
    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    result = transformer_large.large_run(SMALL_GPT, past=8, prompt=8, repeats=2)
    assert {peers.EAGER, transformer_large.UNTUNED, transformer_large.WITH_DLIGHT,
            transformer_large.WITH_ROW_GEMV} <= set(result["decode"])
    assert peers.EAGER in result["prefill"] and result["bandwidth_gbs"] > 0
    assert result["dlight"]["gemv_alone"] == [], "lifted, the weights lie [in, out]: DLight's GEMV takes no product"
    products = {k for k in result["row_gemv"]["scheduled"] if "NT_matmul" in k}
    assert len(products) == 4 * SMALL_GPT.layers + 1, f"each block's four products and the head: {products}"
    model = GPT(SMALL_GPT)
    width = SMALL_GPT.width * 4   # float32
    assert result["weight_bytes_per_token"] == sum(p.numel() * 4 for p in model.parameters()) - (
        SMALL_GPT.vocab + SMALL_GPT.max_len) * width + 2 * width
    assert "no tuning database for a bucket of 8 tokens" in result["missing"][transformer_large.TUNED_PREFILL]
    text = transformer_large.format_large(result, "a test machine")
    assert "| decode after 8 |" in text and "| prefill of 8 |" in text and "memory floor" in text.lower()
    assert "TVM's prefill is not timed" in text


def test_the_large_transformers_tvm_prefill_is_its_bucket_built_with_the_database_found(monkeypatch):
    asked = []
    monkeypatch.setattr(databases, "choose", lambda name, *args, **kwargs: asked.append(name) or Untuned())
    model = GPT(SMALL_GPT)
    ids = transformer.tokens(6, SMALL_GPT.vocab, seed=2)
    run, label = transformer_large.tuned_prefill(model, ids, machine.cpu_target())
    assert asked == [f"{transformer_large.PREFILL_PREFIX}6"] and label == "untuned stand-in"
    with torch.inference_mode():
        want = model.prefill(ids)[0].numpy()
    assert build.relative_error(np.asarray(run()[0].numpy()), want) < peers.RTOL


def test_the_capstone_command_keeps_each_models_row(course, tuned, capsys):
    assert capstone.main(["mobilenet_v2", "--repeats", "2"]) == 0
    kept = _kept("capstone")
    (row,) = kept["rows"]
    assert row["model"] == "mobilenet_v2" and row["trials/task"] == 1 and kept["equal_budget"] == 1
    assert row["kernel time by operator (%)"] and "saved" in capsys.readouterr().out


def _int8_model():
    """A float model with pointwise convolutions, its int8 Relax module, as ``quantize.quantized_model`` returns them."""
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 1),
              torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.Conv2d(32, 16, 1)]
    inputs = [torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    model = quantize.with_batchnorm_statistics(torch.nn.Sequential(*layers).eval(), inputs)
    folded = quantize.fold_batch_norms(model)
    return model, quantize.quantize_pointwise_convs(models.import_to_relax(folded, inputs[0]), quantize.calibrate(folded, inputs))


def test_the_shipping_commands_tune_each_database_into_its_shipped_place_and_prune_it(course, tuned, monkeypatch):
    """How each command tunes (where, with what budget and form) and the pruning after; the tuning itself is
    ``tune_in_stages``' above, so here ``tune`` leaves a copy of the tiny database where it was asked to tune."""
    calls = _copying_tune(monkeypatch, tuned)
    monkeypatch.setattr(transformer, "TinyGPT", lambda: GPT(SMALL_GPT, seed=1))
    model, quantized = _int8_model()
    monkeypatch.setattr(quantize, "quantized_model", lambda target=None: (model, quantized, {}))
    for command in (["prefill", "--length", "16", "--trials", "3"], ["decode", "--trials", "2"], ["int8", "4"]):
        assert shipping.main(command) == 0
    prefill, decode, int8 = calls
    assert prefill[0] == databases.database_dir(transformer.bucket_name(16), TARGET) and prefill[1] == 3
    assert prefill[2] == {"prepack": True, "static_kernels_only": False}
    assert decode[0] == databases.database_dir(transformer.DECODE_NAME, TARGET) and decode[1] == 2
    assert decode[2] == {"prepack": False, "static_kernels_only": True}  # prepacking a symbolic step computes wrong numbers
    assert int8[0] == databases.database_dir(quantize.database_model(TARGET), TARGET) and "space_for" in int8[2]
    for work_dir, *_ in calls:
        assert work_dir.parent == databases.SHIPPED_ROOT
        summary = tuning.database_summary(work_dir)
        assert summary["records"] == summary["workloads"], "one record per kernel, as shipped"


def test_pruning_keeps_the_fastest_records_of_each_kernel(schedules, tmp_path):
    copy = tmp_path / "db"
    shutil.copytree(schedules, copy)
    db = tuning.load_database(copy)
    for record in db.get_all_tuning_records():  # two slower records of each kernel
        for secs in (3e-5, 2e-5):
            db.commit_tuning_record(ms.database.TuningRecord(record.trace, record.workload, [secs], record.target,
                                                             record.args_info))
    del db
    kernels = tuning.database_summary(copy)["workloads"]
    assert tuning.database_summary(copy)["records"] == 3 * kernels
    assert tuning.prune_database(copy, keep=2) == 2 * kernels
    summary = tuning.database_summary(copy)
    assert summary["records"] == 2 * kernels and all(k["best_us"] == pytest.approx(10.0) for k in summary["kernels"])
    assert tuning.prune_database(copy, keep=1) == kernels
    with pytest.raises(ValueError, match="keep must be at least 1"):
        tuning.prune_database(copy, keep=0)


@pytest.mark.parametrize("inputs", [37, 64])
def test_the_row_gemv_schedule_computes_a_linear_layer_whose_width_the_lanes_do_not_divide(inputs):
    """The decoding benchmark's schedule (``gemv.RowGEMV``) on a product with a bias, at a width of whole vectors and not."""
    from tvm import relax
    from tvm.s_tir import dlight as dl

    layer = torch.nn.Linear(inputs, 50).eval()
    x = torch.randn(1, inputs)
    mod, params = transformer.export_to_relax(layer, (x,), None)
    target = machine.cpu_target()
    with target:
        mod = tvm.transform.Sequential([relax.transform.FuseTransposeMatmul(), *build.fusion_passes(target),
                                        dl.ApplyDefaultSchedule(gemv.RowGEMV())])(mod)
    scheduled, _ = transformer.scheduled_kernels(mod)
    assert any("NT_matmul" in k for k in scheduled), scheduled
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()), *[tvm.runtime.tensor(p.numpy()) for p in params])
    out = out if isinstance(out, tvm.runtime.Tensor) else out[0]
    np.testing.assert_allclose(out.numpy(), layer(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    product = mod[next(k for k in scheduled if "NT_matmul" in k)].with_attr("global_symbol", "main")
    assert kernels.heap_allocations(kernels.build(product, target)) == 0, \
        "the lanes' partial sums must live on the stack: from TVM's heap workspace they cost a runtime call per row"


def test_the_decoding_steps_loop_nests_run_in_parallel_and_compute_what_the_default_pipeline_does():
    """``gemv.ParallelSpatial`` on a decoding step of a small GPT: the concatenations and attention's products over
    the past get a parallel loop, pure reshapes are left to become views, and every output equals the default build's."""
    from tvm import relax
    from tvm.s_tir import dlight as dl

    model = GPT(transformer.GPTConfig(vocab=40, width=32, layers=2, heads=4, max_len=32))
    imported = transformer.import_decode(model)
    target = machine.cpu_target()
    with target:
        mod = tvm.transform.Sequential([relax.transform.FuseTransposeMatmul(), *build.fusion_passes(target),
                                        dl.ApplyDefaultSchedule(gemv.ParallelSpatial())])(imported.mod)
    scheduled, left = transformer.scheduled_kernels(mod)
    assert any(k.startswith("concatenate") for k in scheduled) and any(k.startswith("matmul") for k in scheduled), scheduled
    assert all(not k.startswith("reshape") for k in scheduled), f"a pure reshape must stay a view: {scheduled}"
    for name in scheduled:
        assert "T.parallel" in mod[name].script(), f"{name} was marked scheduled without a parallel loop"
    default = transformer.compile_decoder(imported, target)
    parallel = transformer.Decoder(transformer.compile_with_passes(replace(imported, mod=mod), target, []))
    keys, values = transformer.empty_cache(model, 5)
    cache = (torch.randn_like(keys), torch.randn_like(values))
    for ours, theirs in zip(parallel.after_one_step(range(5), 3, cache), default.after_one_step(range(5), 3, cache)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_dlights_cpu_reduction_recomputes_a_one_row_layer_norms_sums_for_every_output():
    """Why the decoding benchmark leaves ``dl.cpu.Reduction`` out (TVM 0.27), as Day 14 shows: on a layer norm of one
    token ``(1, 1, width)`` it puts both sums inside the parallel loop over the outputs; should TVM change that,
    the benchmark can take the rule back and Day 14 must say so."""
    from tvm.s_tir import dlight as dl

    target = machine.cpu_target()
    with target:
        mod = dl.ApplyDefaultSchedule(dl.cpu.Reduction())(transformer.layer_norm_module(rows=1, width=64))
    (name,) = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    tree = kernels.loop_tree(mod[name]).splitlines()
    outer = next(i for i, line in enumerate(tree) if line.startswith("parallel"))
    assert "(T.int64(64))" in tree[outer], "the parallel loop is the one over the 64 outputs"
    under = [line for line in tree[outer + 1:] if line.startswith(" ")]
    assert any("x_sum" in line for line in under) and any("x_var_sum" in line for line in under), \
        "both sums are computed under the loop over the outputs: " + "\n".join(tree)
