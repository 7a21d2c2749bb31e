"""How much tuning travels: reading the studies of a database made on another CPU, used on this one (Day 8).

A study (``python -m helpers.maintainers.transfer_study mobilenet_v2``, kept in
``results/transfer-<model>-<cpu>-<cores>cores.json``) takes the database ``databases.choose`` would
transfer to a machine (one tuned on another CPU) and builds the model several ways, each an *arm*:

* untuned (TVM's default schedules);
* transferred: the other CPU's schedules replayed here, no tuning at all;
* transferred + top-up: those schedules measured here, then a few trials per
  task of search starting from them (``tuning.tune(seed_from=...)``);
* from scratch, after each of the given budgets (trials per task).

Every build was checked against PyTorch, then all of them and PyTorch eager were timed interleaved
in one run, with the minutes of tuning each cost. A study of a CPU class imitated on a bigger one
(``machine.imitated_target``: its instructions, the bigger one's cores and caches) says so
(``-on-<cpu>`` in its name, ``imitated`` inside), and Day 8 prefers a study measured on real hardware.

Introduced on Day 8.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from .results import RESULTS_ROOT

# The arms of a study, as its rows name them.
ARM_UNTUNED, ARM_TRANSFERRED = "untuned", "transferred"


def top_up_label(trials: int) -> str:
    return f"transferred + {trials} trials/task"


def scratch_label(trials: int) -> str:
    return f"from scratch, {trials} trials/task"


def study_label(study: dict) -> str:
    """The CPU a study was measured for, and the one it ran on when imitated: ``znver3 (imitated on a znver5)``."""
    mcpu = json.loads(study["target"])["mcpu"]
    return f"{mcpu} (imitated on a {study['imitated']['on']})" if study.get("imitated") else mcpu


def load_studies(model_name: str, root: Path = RESULTS_ROOT) -> list[dict]:
    """Every study of ``model_name`` kept in ``root``: those measured on real hardware first, each with its ``path``."""
    studies = [{**json.loads(p.read_text()), "path": p} for p in sorted(root.glob(f"transfer-{model_name}-*.json"))]
    return sorted(studies, key=lambda s: bool(s.get("imitated")))


def compare_studies(studies: Sequence[dict]) -> pd.DataFrame:
    """One row per study: the CPU, the database it received, and each build's speedup over eager there."""
    rows = []
    for s in studies:
        row = {"CPU": study_label(s), "database from": f"{s['source']['tuned_for']} ({s['source']['trials_per_task']}/task)"}
        row.update({r["arm"]: r["speedup_vs_eager"] for r in s["rows"] if "speedup_vs_eager" in r})
        rows.append(row)
    return pd.DataFrame(rows)
