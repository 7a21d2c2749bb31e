"""helpers.cache: a build is exported once under its key and loaded the next time, and runs the same."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from tvm import relax

from helpers import build, cache, config, models


def _build_counter(imported, calls):
    def make():
        calls.append(1)
        return tvm.compile(imported.mod, target=tvm.target.Target({"kind": "llvm"}), relax_pipeline="default")

    return make


def _run(module, imported, x):
    vm = relax.VirtualMachine(module, tvm.cpu(0))
    params = [tvm.runtime.tensor(p.numpy()) for p in imported.params]
    return build.to_numpy(vm["main"](tvm.runtime.tensor(x.numpy()), *params))


def test_second_call_loads_the_exported_build_and_gives_the_same_output(tiny_imported, tiny_input, tmp_path):
    calls = []
    key = cache.key("tiny", "llvm")
    first, hit1 = cache.load_or_build("tiny", key, _build_counter(tiny_imported, calls), root=tmp_path)
    second, hit2 = cache.load_or_build("tiny", key, _build_counter(tiny_imported, calls), root=tmp_path)
    assert (hit1, hit2) == (False, True) and len(calls) == 1
    # both are the exported library: the fresh build is not handed over as an executable to compile again
    assert isinstance(first, tvm.runtime.Module) and isinstance(second, tvm.runtime.Module)
    np.testing.assert_array_equal(_run(first, tiny_imported, tiny_input), _run(second, tiny_imported, tiny_input))
    assert [p.name for p in tmp_path.iterdir()] == [f"tiny-{key}.so"], "no partial files are left behind"


def test_the_same_cold_build_asked_for_twice_at_once_is_built_once(tiny_imported, tmp_path):
    calls, together = [], threading.Barrier(2)

    def slow_build():
        time.sleep(1.0)  # long enough for the other request to arrive while this one builds
        return _build_counter(tiny_imported, calls)()

    def ask(_):
        together.wait()
        return cache.load_or_build("tiny", "k", slow_build, root=tmp_path)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(ask, range(2)))
    assert len(calls) == 1, "the second request waited for the first build and loaded it"
    assert sorted(hit for _, hit in results) == [False, True]
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-k.so"], "no lock or partial file is left behind"


def test_every_ingredient_changes_the_key():
    base = cache.key("compile_tuned", "llvm -mcpu=znver4", 123, "db-a")
    assert cache.key("compile_tuned", "llvm -mcpu=znver4", 123, "db-a") == base
    for changed in (("compile_tuned", "llvm -mcpu=znver5", 123, "db-a"), ("compile_tuned", "llvm -mcpu=znver4", 124, "db-a"),
                    ("compile_tuned", "llvm -mcpu=znver4", 123, "db-b")):
        assert cache.key(*changed) != base, changed


def test_file_digest_follows_the_contents(tmp_path):
    a = tmp_path / "a.json"
    a.write_text("one")
    before = cache.file_digest([a])
    a.write_text("two")
    assert cache.file_digest([a]) != before


def test_the_switch_turns_the_cache_off(tiny_imported, tmp_path, monkeypatch):
    monkeypatch.setenv(cache.NO_CACHE_ENV, "1")
    calls = []
    for _ in range(2):
        _, hit = cache.load_or_build("tiny", "k", _build_counter(tiny_imported, calls), root=tmp_path)
        assert not hit
    assert len(calls) == 2 and not list(tmp_path.iterdir())


@pytest.fixture
def suite_cache(tmp_path, monkeypatch):
    """The caches kept for the suite (cache.for_tests), on, in a folder of this test's own."""
    monkeypatch.setattr(cache, "CACHE_ROOT", tmp_path)
    monkeypatch.setenv(config.QUICK_ENV, "1")
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    return tmp_path


def _counting(monkeypatch, owner, name):
    calls, real = [], getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_in_the_suite_a_torch_model_is_imported_once_per_weights_and_shape(suite_cache, monkeypatch, tiny_model, tiny_input):
    exports = _counting(monkeypatch, models, "export")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    first, second = (models.import_to_relax(model, tiny_input) for _ in range(2))
    assert len(exports) == 1
    assert tvm_ffi.structural_equal(first.mod, second.mod) and (second.input_shape, second.input_dtype) == ((2, 3, 32, 32), "float32")
    assert len(first.params) == len(second.params) > 0
    for a, b in zip(first.params, second.params):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with torch.no_grad():
        model[0].weight.add_(1.0)  # other weights
    models.import_to_relax(model, tiny_input)
    models.import_to_relax(model, tiny_input[:1])  # another shape
    assert len(exports) == 3
    assert cache.fingerprint(model) != cache.fingerprint(model.train()), "train mode exports another graph"
    # a layer of a class of the learner's own (conftest's TinyNet) is imported every time, as outside the suite
    models.import_to_relax(tiny_model, tiny_input)
    models.import_to_relax(tiny_model, tiny_input)
    assert len(exports) == 5
    monkeypatch.delenv(config.QUICK_ENV)
    models.import_to_relax(model.eval(), tiny_input[:1])
    assert len(exports) == 6, "a learner's import (not quick mode) is never served from the cache"



def test_in_the_suite_an_untuned_build_is_compiled_once_per_module_and_its_executable_on_demand(
        suite_cache, monkeypatch, tiny_imported, tiny_model, tiny_input, tmp_path):
    compiles = _counting(monkeypatch, tvm, "compile")
    first, second = (build.compile_model(tiny_imported) for _ in range(2))
    assert len(compiles) == 1, "the second build is loaded from the cache"
    assert second.library is not None and second.library.is_file()
    build.check_parity(second, tiny_model, tiny_input)
    # what Day 4 and Day 6 do with an executable: read its LLVM code, export it (compiled again for that)
    assert "define" in second.executable.mod.imports[0].inspect_source("ll")
    second.executable.export_library(str(tmp_path / "again.so"))
    assert len(compiles) == 2 and (tmp_path / "again.so").stat().st_size > 0
    other = models.ImportedModel(mod=relax.transform.DecomposeOpsForInference()(tiny_imported.mod),
                                 params=tiny_imported.params, input_shape=tiny_imported.input_shape,
                                 input_dtype=tiny_imported.input_dtype)
    build.compile_model(other)
    assert len(compiles) == 3, "another module is another build"
    build.compile_model(tiny_imported, pipeline=relax.get_pipeline("default"))  # a pipeline given as passes: never kept
    monkeypatch.delenv(config.QUICK_ENV)
    fresh = build.compile_model(tiny_imported)
    assert len(compiles) == 5 and fresh.library is None, "a learner's build (not quick mode) is always compiled"
    assert isinstance(fresh.executable, tvm.runtime.Executable)


def test_kernels_prepared_for_tuning_are_kept_per_module_and_read_back_alike(tmp_path, monkeypatch, tiny_imported):
    from helpers import nchwc, tuning

    monkeypatch.setattr(cache, "CACHE_ROOT", tmp_path)
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    fuses = _counting(monkeypatch, nchwc, "fuse")
    target = tvm.target.Target({"kind": "llvm"})
    first, second = (tuning.prepare(tiny_imported.mod, target, prepack=True) for _ in range(2))
    assert len(fuses) == 1 and tvm_ffi.structural_equal(first, second)
    assert [t.task_name for t in tuning.extract_tasks(first, target)] == [t.task_name for t in tuning.extract_tasks(second, target)]
    tuning.prepare(tiny_imported.mod, target, prepack=False)  # prepared another way
    assert len(fuses) == 2
    monkeypatch.setenv(cache.NO_CACHE_ENV, "1")
    tuning.prepare(tiny_imported.mod, target, prepack=True)
    assert len(fuses) == 3
