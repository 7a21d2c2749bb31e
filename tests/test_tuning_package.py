"""helpers.tuning as a package of one-job modules: its names, and a compile cache that no change to a build's code fools."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import tvm

from helpers import tuning
from test_architecture import REPO, import_graph

HELPERS = REPO / "helpers"
# The tuning package's modules that run only while searching (a build never runs them), and the course's modules
# a build's code imports without their code shaping what is built: the cache and its keys' parts (the target
# is in the key itself), error messages, settings, the imported model's record, stderr capture.
SEARCH_ONLY = {"__init__", "search", "builder", "progress"}
NOT_SHAPING = {"helpers.cache", "helpers.errors", "helpers.config", "helpers.models", "helpers.machine", "helpers.capture"}


def test_every_name_the_notebooks_and_the_course_use_is_the_packages():
    used = set()
    for path in [*(REPO / "solutions").glob("*/*.ipynb"), *HELPERS.rglob("*.py"), *(REPO / "tests").glob("*.py")]:
        used |= set(re.findall(r"\btuning\.([A-Za-z_][A-Za-z0-9_]*)", path.read_text()))
    modules = {p.stem for p in (HELPERS / "tuning").glob("*.py")}
    missing = sorted(name for name in used - modules if not hasattr(tuning, name))
    assert not missing, f"tuning.{missing} is used but not the package's"
    assert not any(name.startswith("_") for name in used - {"__all__"}), "a private name of tuning used outside it"
    for name in ("prepare", "extract_tasks", "load_database", "succeeded", "per_call_kernels"):  # once private, now named
        assert name in tuning.__all__


def test_build_code_holds_every_file_whose_code_shapes_a_tuned_build():
    """The modules a tuned build runs, and the course's modules they import (however deep) that transform its IR."""
    graph = import_graph()
    builds = {f"helpers.tuning.{p.stem}" for p in (HELPERS / "tuning").glob("*.py") if p.stem not in SEARCH_ONLY}
    reached, todo = set(), list(builds)
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += [dep for dep in graph[module] if dep.startswith("helpers.") and dep not in NOT_SHAPING]
    expected = {HELPERS.joinpath(*m.split(".")[1:]).with_suffix(".py") for m in reached}
    assert {Path(p) for p in tuning.BUILD_CODE} == expected


def test_a_change_to_any_file_of_build_code_builds_again(tmp_path, monkeypatch, tiny_imported):
    copies = []
    for path in tuning.BUILD_CODE:
        copies.append(tmp_path / "code" / Path(path).relative_to(HELPERS))
        copies[-1].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copies[-1])
    monkeypatch.setattr(tuning.tasks, "BUILD_CODE", copies)
    monkeypatch.setattr(tuning.apply, "BUILD_CODE", copies)
    work_dir = tmp_path / "db"
    work_dir.mkdir()
    for name in (tuning.WORKLOAD_FILE, tuning.RECORD_FILE):
        (work_dir / name).write_text("")
    target = tvm.target.Target({"kind": "llvm"})

    def keys():
        return (tuning.tasks.prepared_key(tiny_imported.mod, target, True, "NCHW"),
                tuning.apply.tuned_build_key(tiny_imported.mod, target, work_dir, None, False, "NCHW"))

    before = keys()
    assert keys() == before, "the keys are deterministic"
    for copy in copies:
        original = copy.read_text()
        copy.write_text(original + "\n# changed\n")
        changed = keys()
        assert changed[0] != before[0] and changed[1] != before[1], f"a change to {copy.name} would reuse old builds"
        copy.write_text(original)
    assert keys() == before
