"""The course's results files: what a run measured, kept in ``results/`` with the machine it ran on (Day 8).

Every measurement the course keeps (the benchmark tables, the transfer studies, the capstone, the
GPU recordings) is one JSON record per kind of result and machine kind, stamped with the time it was
measured (``save_record``), in a file named by the CPU and core count (``results_path``); a result
measured for a CPU class imitated on this one (``machine.imitated_target``) says so in its name
(``results_path_here``). Beside each tuning database, its curve (``read_curve``) says how it was made.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import machine
from .config import REPO

if TYPE_CHECKING:
    import tvm

RESULTS_ROOT = REPO / "results"
CURVE_FILE = "tuning_curve.json"


def slug(text: str) -> str:
    """A name fit for a file name: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def results_path(target: tvm.target.Target, suffix: str, root: Path | None = None, kind: str = "benchmark") -> Path:
    """``results/<kind>-<cpu>-<cores>cores.<suffix>`` (``root``: ``RESULTS_ROOT``): one file per kind of result and machine kind."""
    root = RESULTS_ROOT if root is None else root
    mcpu = str(target.attrs.get("mcpu", target.kind.name))
    return root / f"{kind}-{slug(mcpu)}-{target.attrs.get('num-cores')}cores.{suffix}"


def results_path_here(target: tvm.target.Target, suffix: str, kind: str) -> Path:
    """``results_path`` for a result measured on this CPU: named ``...-on-<this cpu>`` when ``target`` is
    a CPU class imitated on this one (its instructions, this CPU's cores, caches and clock)."""
    path = results_path(target, suffix, kind=kind)
    return path.with_name(f"{path.stem}-on-{machine.cpu_name()}{path.suffix}") if machine.is_imitated(target) else path


def save_record(path: Path, **fields: object) -> dict:
    """Write ``fields`` as JSON to ``path``, stamped with the time measured (UTC); return what was written."""
    record = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def read_curve(work_dir: str | Path) -> dict:
    """The tuning curve saved beside a database: ``{"model", "machine", "points": [...]}``."""
    path = Path(work_dir) / CURVE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"No tuning curve at {path}: it is written by "
            "`python -m helpers.maintainers.benchmark tune MODEL --stages ...`."
        )
    return json.loads(path.read_text())
