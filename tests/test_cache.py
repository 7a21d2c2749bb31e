"""helpers.cache: a build is exported once under its key and loaded the next time, and runs the same."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tvm
from tvm import relax

from helpers import build, cache


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
