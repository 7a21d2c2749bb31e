"""Which tuning database a model is built with, where it came from, and why that one.

Databases live in three places, one directory each per model, batch, CPU and core
count (``mobilenet_v2-b1-znver4-2cores``):

* ``tuning/``: shipped with the course (in git), made by ``python -m helpers.maintainers.benchmark tune``;
* ``build/tuning/``: the learner's own, tuned on this machine in full mode;
* ``build/tuning-quick/``: made in quick mode (``make test``, CI) with tiny budgets.
  Only quick mode reads them: a test run never becomes the learner's database.

A database tuned for this CPU and core count applies as it is. One tuned for
another CPU *transfers*: its records are traces of schedule primitives, which
replay on any x86-64 CPU (the build is then checked for parity, and labelled).
``choose`` takes, among the databases for this CPU's vector width, one whose
convolutions were tuned in Day 7's channel blocks (``NCHW16c``, ``NCHW8c``) before
one tuned in NCHW (the course's first databases, which the blocked ones beat on
every model where both were measured); then one tuned for this CPU if there is any
(its schedules were measured here; a top-up seeded from another CPU's database
measured that one's schedules here too), the largest tuning budget first (trials
per task, a seeded top-up counting its seed's); only without one, a transferred
database: the largest budget, then the CPU most like this one. It tunes only when
nothing exists.

``python -m helpers.databases list`` shows them all; ``... remove`` deletes the
learner's own and the test runs' (never the shipped ones).

Introduced on Day 7.
"""

from __future__ import annotations

import argparse
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import tvm

from . import config, machine, nchwc, tuning
from .build import CompiledModel
from .errors import TuningDatabaseError
from .models import ImportedModel

REPO = config.REPO
SHIPPED_ROOT = REPO / "tuning"
OWN_ROOT = REPO / "build" / "tuning"
QUICK_ROOT = REPO / "build" / "tuning-quick"
SHIPPED, YOURS, TEST_RUN = "shipped", "yours", "test run"
_NAME = re.compile(r"^(?P<model>[A-Za-z0-9_.]+)-b(?P<batch>\d+)-(?P<mcpu>.+)-(?P<cores>\d+)cores$")


def database_dir(model: str, target: tvm.target.Target, batch: int = 1, root: Path | None = None) -> Path:
    """Where a database for a model on a target lives under ``root`` (default: ``SHIPPED_ROOT``).

    The name carries what a record was measured for: model, batch, the CPU LLVM
    tunes for and the core count, e.g. ``mobilenet_v2-b1-znver4-2cores``.
    """
    root = SHIPPED_ROOT if root is None else root
    mcpu = str(target.attrs.get("mcpu", target.kind.name))
    return root / f"{model}-b{batch}-{mcpu}-{target.attrs.get('num-cores')}cores"


@dataclass(frozen=True)
class Database:
    """One candidate tuning database, as a notebook should describe it."""

    path: Path
    origin: str  # SHIPPED, YOURS or TEST_RUN
    mcpu: str
    cores: int
    trials_per_task: float | None
    transferred: bool
    reason: str = ""
    tuned_now: bool = False
    layout: str = nchwc.PLAIN  # the convolutions' activation layout its kernels were tuned in

    @property
    def blocked(self) -> bool:
        """Whether its convolutions were tuned in channel blocks (Day 7), as the course's current databases are."""
        return nchwc.block_of(self.layout) is not None

    @property
    def tuned_for(self) -> str:
        return f"{self.mcpu}, {self.cores} cores"

    @property
    def budget_text(self) -> str:
        return "budget unknown" if self.trials_per_task is None else f"{self.trials_per_task:g} trials/task"

    def label(self) -> str:
        """``transferred from znver4, 2 cores (shipped, 64 trials/task)`` or ``tuned for this CPU (...)``."""
        where = f"transferred from {self.tuned_for}" if self.transferred else f"tuned for this CPU, {self.tuned_for}"
        return f"{where} ({self.origin}, {self.budget_text})"

    def prepacked(self) -> bool:
        """Whether it was tuned with weight prepacking (then its builds transform the weights once, at load)."""
        return tuning.tuned_with_prepacking(self.path)

    def compile(self, imported: ImportedModel, target: tvm.target.Target, layout: str | None = None) -> CompiledModel:
        """Build ``imported`` with this database, transferring records when it was tuned elsewhere.
        ``layout``: the convolutions' layout, when not the one the database was tuned in."""
        return tuning.compile_tuned(imported, target, self.path, transfer=self.transferred, layout=layout)


def roots() -> list[tuple[str, Path]]:
    """Where databases are looked for in this mode: test runs' only in quick mode."""
    found = [(SHIPPED, SHIPPED_ROOT), (YOURS, OWN_ROOT)]
    return found + [(TEST_RUN, QUICK_ROOT)] if config.quick() else found


def own_root() -> Path:
    """Where a database tuned now goes: the test runs' place in quick mode, the learner's otherwise."""
    return QUICK_ROOT if config.quick() else OWN_ROOT


def _describe(path: Path, origin: str, target: tvm.target.Target) -> Database | None:
    """A candidate for ``target``, or None when the directory is not a usable database."""
    match = _NAME.match(path.name)
    if not match:
        return None
    try:
        targets = tuning.database_targets(path)
    except tuning.TuningDatabaseError:
        return None
    if not targets:
        return None
    mcpu, cores = match["mcpu"], int(match["cores"])
    exact = str(target) in targets
    return Database(path, origin, mcpu, cores, tuning.budget(path), transferred=not exact, layout=tuning.tuned_layout(path))


def candidates(
    model: str, target: tvm.target.Target, batch: int = 1, places: Sequence[tuple[str, Path]] | None = None
) -> list[Database]:
    """Every usable database for ``model`` at ``batch``, for this CPU or transferable to it.

    Outside quick mode, a database tuned in quick mode is never a candidate,
    wherever it is (older versions of the course kept them with the learner's).
    """
    found = []
    for origin, root in places if places is not None else roots():
        for path in sorted(Path(root).glob(f"{model}-b{batch}-*cores")):
            if not config.quick() and tuning.tuned_in_quick_mode(path):
                continue
            db = _describe(path, origin, target)
            if db is not None and _NAME.match(path.name)["model"] == model:
                found.append(db)
    return found


def _likeness(db: Database, target: tvm.target.Target) -> tuple:
    """How close the database's machine is to this one: same core count, then shared CPU features."""
    here = machine.cpu_features(target)
    try:
        there = machine.cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": db.mcpu}))
    except Exception:  # a CPU name this LLVM does not know
        there = set()
    shared = len(here & there) / max(1, len(here | there))
    return (db.cores == target.attrs.get("num-cores"), round(shared, 3))


def same_vector_width(db: Database, target: tvm.target.Target) -> bool:
    """Whether the database was tuned for a CPU with this one's widest vectors (AVX-512, AVX2, ...).

    Schedules travel within a class, not across it: tiles sized for 32 zmm registers spill on 16
    ymm ones. Measured on a real Zen 3 (AVX2), ResNet-50 built with the Zen 4's (AVX-512) schedules
    ran at a quarter of eager's speed.
    """
    try:
        there = machine.vector_width_bits(tvm.target.Target({"kind": "llvm", "mcpu": db.mcpu}))
    except Exception:  # a CPU name this LLVM does not know
        return False
    return there == machine.vector_width_bits(target)


def kind(db: Database, target: tvm.target.Target) -> tuple[bool, bool]:
    """What ranks a database before any budget or origin: tuned for this CPU's vector width, then in
    channel blocks. Databases of one kind compete on where they were tuned and on their budgets."""
    return same_vector_width(db, target), db.blocked


def rank(found: Sequence[Database], target: tvm.target.Target) -> list[Database]:
    """Best first: tuned for this CPU's vector width (AVX-512, AVX2); then tuned in channel blocks
    before NCHW; then tuned for this CPU (measured here) before transferred; then the largest budget;
    then the most similar CPU.

    The layout comes before the origin: with code built for a Zen 4 and a Zen 5, the Zen 4's and Zen 5's
    own NCHW databases ran ResNet-50, MobileNetV2 and EfficientNet-B0 1.7-3x slower than the
    channel-blocked ones tuned on an Intel Xeon (results/HISTORY.md, "Which database a CPU gets"), and on
    their own CPUs they lost to PyTorch. Budgets do not compare across CPUs: 64 trials per task
    measured on another CPU are not known to beat 32 measured here (issue 27), and a database seeded
    from a transferred one holds its schedules measured here, so it loses nothing by being preferred."""
    return sorted(
        found,
        key=lambda d: (*kind(d, target), not d.transferred, d.trials_per_task or 0.0, _likeness(d, target)),
        reverse=True,
    )


def choose(
    model: str,
    imported: ImportedModel | None,
    target: tvm.target.Target,
    batch: int = 1,
    trials_per_task: int = 16,
    max_trials_global: int | None = None,
    tune_if_missing: bool = True,
    places: Sequence[tuple[str, Path]] | None = None,
    budget: float | None = None,
    tune_root: Path | None = None,
    prepack: bool = True,
    space_for=None,
) -> Database:
    """The database to build ``model`` with on ``target``, with the reason it was chosen.

    ``budget`` asks for databases tuned with exactly that many trials per task
    (to compare models at equal budgets); the others are then left out. When no
    database exists at all, one is tuned now under ``trials_per_task`` (and
    ``max_trials_global``) into the learner's directory, or the test runs' in
    quick mode (or ``tune_root``); with ``tune_if_missing=False`` that is an error instead (and
    ``imported``, what would be tuned, may be None).
    ``places`` replaces the (origin, root) pairs searched, for tests. ``prepack`` and
    ``space_for`` go to ``tuning.tune`` when a database is tuned now.
    """
    found = candidates(model, target, batch, places)
    if budget is not None:
        found = [d for d in found if d.trials_per_task == budget]
    if found:
        ranked = rank(found, target)
        best = ranked[0]
        if len(ranked) == 1:
            why = "the only database for this model"
        else:
            others = "; ".join(f"{d.path.name} ({d.origin}, {d.budget_text})" for d in ranked[1:])
            if not best.transferred:
                here = sum(not d.transferred for d in ranked)
                why = (f"tuned for this CPU (its schedules were timed here), the largest budget of the {here} such "
                       f"among {len(ranked)} candidates (also found: {others})")
            else:
                width = f"tuned for {machine.vector_width_bits(target)}-bit vectors like this CPU's, " if same_vector_width(best, target) else ""
                own = [d for d in ranked if not d.transferred]
                if own and best.blocked:
                    first = (f"{best.layout} (Day 7's channel blocks) before NCHW: the {len(own)} tuned for this CPU "
                             f"are NCHW, which the blocked databases beat; ")
                else:
                    first = "none was tuned for this CPU; "
                why = f"{first}{width}the largest budget of {len(ranked)} candidates (also found: {others})"
        if budget is not None:
            why += f", at the budget asked for ({budget:g} trials/task)"
        return replace(best, reason=why)
    if not tune_if_missing:
        wanted = "" if budget is None else f" tuned with {budget:g} trials per task"
        searched = ", ".join(str(root) for _, root in (places if places is not None else roots()))
        raise TuningDatabaseError(
            f"No tuning database for {model} at batch {batch}{wanted}, for this CPU or any other, "
            f"in {searched}. Tune one: python -m helpers.maintainers.benchmark tune {model} --stages 8 16."
        )
    if imported is None:
        raise ValueError(f"No tuning database for {model}, and no model given to tune one: pass the imported model.")
    path = database_dir(model, target, batch, tune_root or own_root())
    tuning.tune(
        imported.mod, target, path, max_trials_per_task=trials_per_task, max_trials_global=max_trials_global,
        prepack=prepack, space_for=space_for,
    )
    origin = TEST_RUN if config.quick() else YOURS
    tuned = _describe(path, origin, target)
    return replace(tuned, reason="no database existed for this model, so one was tuned now", tuned_now=True)


# ------------------------------------------------------------------ list / remove


def everything(target: tvm.target.Target | None = None) -> list[Database]:
    """All databases in the three places, whatever the mode, described for ``target``."""
    target = target or machine.cpu_target()
    found = []
    for origin, root in ((SHIPPED, SHIPPED_ROOT), (YOURS, OWN_ROOT), (TEST_RUN, QUICK_ROOT)):
        for path in sorted(Path(root).glob("*cores")) if Path(root).is_dir() else []:
            db = _describe(path, origin, target)
            if db is not None:
                found.append(db)
    return found


def remove(which: str, names: Sequence[str] = ()) -> list[Path]:
    """Delete the learner's own databases (``yours``), the test runs' (``test``), or both (``all``).

    ``names`` limits it to those directory names. Shipped databases are never removed.
    """
    places = {"yours": [OWN_ROOT], "test": [QUICK_ROOT], "all": [OWN_ROOT, QUICK_ROOT]}
    if which not in places:
        raise ValueError(f"remove what? 'yours', 'test' or 'all', got {which!r}.")
    removed = []
    for root in places[which]:
        for path in sorted(root.glob("*cores")) if root.is_dir() else []:
            if not names or path.name in names:
                shutil.rmtree(path)
                removed.append(path)
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.databases", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every tuning database, where it came from and how it fits this CPU")
    rm = sub.add_parser("remove", help="delete your own databases and/or the test runs' (never the shipped ones)")
    rm.add_argument("which", choices=["yours", "test", "all"])
    rm.add_argument("names", nargs="*", help="only these directory names")
    args = parser.parse_args(argv)
    if args.command == "list":
        target = machine.cpu_target()
        print(f"This machine: {target.attrs['mcpu']}, {target.attrs['num-cores']} cores")
        listed = everything(target)
        chosen = set()
        for model, batch in {(_NAME.match(d.path.name)["model"], int(_NAME.match(d.path.name)["batch"])) for d in listed}:
            found = candidates(model, target, batch)
            if found:
                chosen.add(rank(found, target)[0].path)
        for db in listed:
            mark = "*" if db.path in chosen else " "
            print(f"{mark} {db.origin:>9}  {db.path.name:<44} {db.layout:<8} {db.label()}")
        print("* the database the course builds that model with here (databases.choose); seed a top-up from it")
    else:
        for path in remove(args.which, args.names):
            print(f"removed {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
