"""helpers.databases: which database a model is built with, on any CPU, and never a test run's in full mode.

One tiny real tuning run (TinyNet, 1 trial per task) is copied around to play
the shipped database, the learner's own, a test run's and one from another CPU.
"""

import contextlib
import io
import json

import pytest
import tvm

from helpers import build, config, databases, machine, tuning
from helpers.errors import TuningDatabaseError


def _target(mcpu="znver4", cores=2):
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores})


def _other_cpu() -> str:
    """Another CPU with this one's vector width: a database from it is a transfer within the class."""
    pair = ("skylake-avx512", "znver5") if machine.vector_width_bits() == 512 else ("haswell", "skylake")
    return pair[0] if machine.cpu_name() != pair[0] else pair[1]


def _other_width_cpu() -> str:
    """A CPU whose widest vectors differ from this one's (AVX2 here if this one has AVX-512, and the reverse)."""
    return "haswell" if machine.vector_width_bits() == 512 else "skylake-avx512"


def _set_budget(path, trials_per_task, quick=False, layout=None):
    settings = json.loads((path / tuning.SETTINGS_FILE).read_text())
    settings.update(trials_per_task=trials_per_task, quick=quick)
    if layout is not None:
        settings["layout"] = layout
    (path / tuning.SETTINGS_FILE).write_text(json.dumps(settings))


@pytest.fixture
def places(tmp_path, monkeypatch):
    """The three places databases live, moved to a temporary directory."""
    roots = {name: tmp_path / name for name in ("shipped", "own", "quick")}
    monkeypatch.setattr(databases, "SHIPPED_ROOT", roots["shipped"])
    monkeypatch.setattr(databases, "OWN_ROOT", roots["own"])
    monkeypatch.setattr(databases, "QUICK_ROOT", roots["quick"])
    return roots


@pytest.fixture(scope="module")
def tiny_db(tiny_imported, tmp_path_factory):
    """A real database for TinyNet on this machine (1 trial per task, prepacked, as the course tunes)."""
    path = tmp_path_factory.mktemp("tiny") / "db"
    with contextlib.redirect_stdout(io.StringIO()):
        tuning.tune(tiny_imported.mod, machine.cpu_target(), path, max_trials_per_task=1, prepack=True)
    return path


def test_database_dir_names_what_its_records_are_valid_for(tmp_path):
    path = databases.database_dir("resnet50", _target("skylake-avx512", 16), batch=4, root=tmp_path)
    assert path == tmp_path / "resnet50-b4-skylake-avx512-16cores"
    assert databases.database_dir("mobilenet_v2", _target()).parent == databases.SHIPPED_ROOT


def test_a_test_runs_database_is_never_used_in_full_mode(tiny_imported, places, monkeypatch):
    """Issue: a quick-mode run's 40-trial database became the learner's, and tuned TVM was 7x slower than eager."""
    target = machine.cpu_target()
    monkeypatch.setenv(config.QUICK_ENV, "1")
    with contextlib.redirect_stdout(io.StringIO()):
        quick = databases.choose("tiny", tiny_imported, target, trials_per_task=1, max_trials_global=2)
    assert quick.tuned_now and quick.origin == databases.TEST_RUN and quick.path.parent == places["quick"]
    assert tuning.tuned_in_quick_mode(quick.path) and tuning.budget(quick.path) <= 1
    # Quick mode finds it again; full mode does not see it at all.
    assert databases.choose("tiny", tiny_imported, target, tune_if_missing=False).path == quick.path
    monkeypatch.delenv(config.QUICK_ENV)
    assert databases.candidates("tiny", target) == []
    with pytest.raises(TuningDatabaseError, match="No tuning database for tiny"):
        databases.choose("tiny", tiny_imported, target, tune_if_missing=False)
    # Nor when an older course left a quick-mode database among the learner's own.
    stale = databases.database_dir("tiny", target, root=places["own"])
    stale.parent.mkdir(parents=True)
    quick.path.rename(stale)
    assert databases.candidates("tiny", target) == []


def test_choose_takes_one_tuned_for_this_cpu_first_then_the_largest_budget(tiny_imported, tiny_db, places, retarget):
    import shutil

    target = machine.cpu_target()
    shipped = databases.database_dir("tiny", target, root=places["shipped"])
    own = databases.database_dir("tiny", target, root=places["own"])
    foreign = databases.database_dir("tiny", _target(_other_cpu(), target.attrs["num-cores"]), root=places["shipped"])
    shutil.copytree(tiny_db, shipped)
    shutil.copytree(tiny_db, own)
    retarget(tiny_db, foreign, _target(_other_cpu(), target.attrs["num-cores"]))
    _set_budget(shipped, 16)
    _set_budget(own, 32)
    _set_budget(foreign, 64)
    # 64 trials per task timed on another CPU are not known to beat 32 timed here: this CPU's, largest budget
    best = databases.choose("tiny", tiny_imported, target, tune_if_missing=False)
    assert best.path == own and not best.transferred and best.origin == databases.YOURS
    assert "tuned for this CPU" in best.reason and "of the 2 such among 3 candidates" in best.reason
    assert best.label().startswith("tuned for this CPU")
    shutil.rmtree(own)
    shutil.rmtree(shipped)  # none tuned here: the transferred one, labelled so
    best = databases.choose("tiny", tiny_imported, target, tune_if_missing=False)
    assert best.path == foreign and best.transferred and best.reason == "the only database for this model"
    assert best.label() == f"transferred from {_other_cpu()}, {target.attrs['num-cores']} cores (shipped, 64 trials/task)"
    shutil.copytree(tiny_db, shipped)
    _set_budget(shipped, 16)
    # Equal budgets on request: only databases tuned with exactly that budget.
    assert databases.choose("tiny", tiny_imported, target, tune_if_missing=False, budget=16).path == shipped
    with pytest.raises(TuningDatabaseError, match="tuned with 8 trials per task"):
        databases.choose("tiny", tiny_imported, target, tune_if_missing=False, budget=8)


def test_a_database_from_another_cpu_transfers_builds_and_matches_pytorch(
    tiny_model, tiny_input, tiny_imported, tiny_db, places, retarget
):
    target = machine.cpu_target()
    other = _target(_other_cpu(), target.attrs["num-cores"])
    foreign = databases.database_dir("tiny", other, root=places["shipped"])
    retarget(tiny_db, foreign, other)
    _set_budget(foreign, 16)
    chosen = databases.choose("tiny", tiny_imported, target, tune_if_missing=False)
    assert chosen.transferred and chosen.mcpu == _other_cpu() and chosen.reason == "the only database for this model"
    compiled = chosen.compile(tiny_imported, target)
    assert build.check_parity(compiled, tiny_model, tiny_input) < 1e-4


def test_a_database_for_this_vector_width_beats_a_larger_one_for_another(tiny_imported, tiny_db, places, retarget):
    target = machine.cpu_target()
    cores = target.attrs["num-cores"]
    same = databases.database_dir("tiny", _target(_other_cpu(), cores), root=places["shipped"])
    wider = databases.database_dir("tiny", _target(_other_width_cpu(), cores), root=places["shipped"])
    retarget(tiny_db, same, _target(_other_cpu(), cores))
    retarget(tiny_db, wider, _target(_other_width_cpu(), cores))
    _set_budget(same, 16)
    _set_budget(wider, 64)
    best = databases.choose("tiny", tiny_imported, target, tune_if_missing=False)
    assert best.path == same and f"tuned for {machine.vector_width_bits()}-bit vectors" in best.reason
    assert databases.rank(databases.candidates("tiny", target, places=[("shipped", places["shipped"])]), target)[1].path == wider


def test_a_channel_blocked_database_from_another_cpu_beats_an_nchw_one_tuned_here(tiny_imported, tiny_db, places, retarget):
    """Issue 26: a Zen 4 got its own NCHW ResNet-50 database, 3x slower than the blocked one from a Xeon."""
    import shutil

    target = machine.cpu_target()
    cores = target.attrs["num-cores"]
    own = databases.database_dir("tiny", target, root=places["own"])
    blocked = databases.database_dir("tiny", _target(_other_cpu(), cores), root=places["shipped"])
    wider = databases.database_dir("tiny", _target(_other_width_cpu(), cores), root=places["shipped"])
    shutil.copytree(tiny_db, own)
    retarget(tiny_db, blocked, _target(_other_cpu(), cores))
    retarget(tiny_db, wider, _target(_other_width_cpu(), cores))
    _set_budget(own, 64)
    _set_budget(blocked, 16, layout="NCHW16c")
    _set_budget(wider, 96, layout="NCHW8c")
    best = databases.choose("tiny", tiny_imported, target, tune_if_missing=False)
    assert best.path == blocked and best.blocked and best.transferred
    assert best.reason.startswith("NCHW16c (Day 7's channel blocks) before NCHW: the 1 tuned for this CPU are NCHW")
    ranked = databases.rank(databases.candidates("tiny", target), target)
    assert [d.path for d in ranked] == [blocked, own, wider]  # the vector width still comes first
    # Among blocked databases the old order holds: tuned here first, whatever the budgets.
    _set_budget(own, 8, layout="NCHW16c")
    assert databases.choose("tiny", tiny_imported, target, tune_if_missing=False).path == own


def test_the_nearest_cpu_wins_among_transfers_of_equal_budget():
    here = _target("znver5", 2)
    far = databases.Database(databases.SHIPPED_ROOT / "m-b1-haswell-2cores", "shipped", "haswell", 2, 16, True)
    near = databases.Database(databases.SHIPPED_ROOT / "m-b1-znver4-2cores", "shipped", "znver4", 2, 16, True)
    other_cores = databases.Database(databases.SHIPPED_ROOT / "m-b1-znver4-8cores", "shipped", "znver4", 8, 16, True)
    assert databases.rank([far, other_cores, near], here) == [near, other_cores, far]  # haswell: AVX2, not AVX-512
    also_avx512 = databases.Database(databases.SHIPPED_ROOT / "m-b1-icelake-server-2cores", "shipped", "icelake-server", 2, 16, True)
    assert databases.rank([also_avx512, near], here) == [near, also_avx512]  # the same width: the more similar CPU


def test_remove_deletes_the_learners_and_test_runs_databases_never_the_shipped(tiny_db, places):
    import shutil

    for root in places.values():
        shutil.copytree(tiny_db, root / "tiny-b2-znver4-2cores")
    assert [p.parent.name for p in databases.remove("test")] == ["quick"]
    assert [p.parent.name for p in databases.remove("all")] == ["own"]
    assert (places["shipped"] / "tiny-b2-znver4-2cores").is_dir()
    with pytest.raises(ValueError, match="'yours', 'test' or 'all'"):
        databases.remove("shipped")


def test_list_names_every_database_and_how_it_fits(tiny_db, places, capsys):
    import shutil

    shutil.copytree(tiny_db, places["quick"] / "tiny-b2-skylake-avx512-2cores")
    assert databases.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "This machine:" in out and "test run" in out and "tiny-b2-skylake-avx512-2cores" in out


def test_every_shipped_database_says_its_budget():
    for directory in (p for p in databases.SHIPPED_ROOT.iterdir() if p.is_dir()):
        assert tuning.budget(directory), f"{directory.name}: course_tuning.json lacks trials_per_task"
        assert not tuning.tuned_in_quick_mode(directory), f"{directory.name} was tuned in quick mode"


def test_the_fast_target_reader_agrees_with_metaschedules_reader_on_every_shipped_database():
    """``candidates`` reads targets from the records file alone (30 times faster than loading the database)."""
    for directory in (p for p in databases.SHIPPED_ROOT.iterdir() if p.is_dir()):
        assert tuning.database_targets(directory) == tuning.database_summary(directory)["targets"], directory.name



def test_databases_are_compared_built_checked_and_timed_beside_the_peers(
    tiny_model, tiny_input, tiny_imported, tiny_db, tmp_path, retarget, monkeypatch
):
    """`python -m helpers.maintainers.benchmark compare`: how a database version is chosen for shipping, or for a CPU."""
    from helpers import peers
    from helpers.maintainers import table

    monkeypatch.setenv(config.QUICK_ENV, "1")  # the peers a quick run builds: no torch.compile
    target = machine.cpu_target()
    other = tmp_path / f"tiny-b1-{_other_cpu()}-2cores"
    retarget(tiny_db, other, _target(_other_cpu(), target.attrs["num-cores"]))
    _set_budget(other, 16)
    timings = table.time_databases(tiny_model, tiny_input, tiny_imported, [tiny_db, other], target, repeats=3)
    labels = [t.label for t in timings]
    assert peers.EAGER in labels and labels[-2:] == [table.database_label(tiny_db), table.database_label(other)]
    assert table.database_label(other) == f"TVM {other.name} (NCHW, 16 trials/task)"
    assert all(len(t.times_ms) >= 3 and t.median_ms > 0 for t in timings)
