"""What the reference machines measured, printed beside what this machine measures (every day, from Day 0).

A measured number means little alone: is 0.8x bad, or what every laptop gets? Each day's key
results call ``show(key, value, unit)``: it prints the value measured here and, below it, what
the same cell gave at full size on the machines recorded in ``results/reference/`` (one JSON file
per machine, CPU named as TVM names it). The value measured here also travels in the output's
metadata, so that a maintainer can harvest a full-size execution of every day into a new
reference file (docs/maintainers.md, "Editing a day").

Introduced on Day 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from . import config

REFERENCE_ROOT = config.REPO / "results" / "reference"
METADATA_KEY = "tvm-course-reference"


@dataclass(frozen=True)
class Recorded:
    """One key's value as a reference machine measured it."""

    machine: str      # how the machine is named to the learner, e.g. "AMD EPYC Zen 4 (znver4), 2 cores"
    cpu: str          # LLVM's name of its CPU
    value: float
    unit: str


def recorded(key: str, root: Path = REFERENCE_ROOT) -> list[Recorded]:
    """What every reference machine measured for ``key``, in the order of their files' names."""
    found = []
    for path in sorted(Path(root).glob("*.json")):
        data = json.loads(path.read_text())
        entry = data.get("values", {}).get(key)
        if entry is not None:
            found.append(Recorded(data["machine"], data["cpu"], float(entry["value"]), entry.get("unit", "")))
    return found


def _format(value: float, unit: str, digits: int) -> str:
    if not math.isfinite(value):
        return str(value)
    text = f"{value:.{digits}f}"
    if unit in ("x", "×"):
        return f"{text}x"
    if unit == "%":
        return f"{text} %"
    return f"{text} {unit}".rstrip()


def line(key: str, value: float, unit: str = "", digits: int = 2, root: Path = REFERENCE_ROOT) -> str:
    """The text ``show`` prints: this machine's value, then each reference machine's."""
    here = f"{key.split('.', 1)[-1].replace('_', ' ')}: {_format(value, unit, digits)} here"
    if config.quick():
        here += " (reduced sizes: TVM_COURSE_QUICK is set)"
    others = recorded(key, root)
    if not others:
        return here + "; no reference machine has recorded this value yet"
    refs = "; ".join(f"{_format(r.value, r.unit, digits)} on {r.machine}" for r in others)
    return f"{here}; reference, at full size: {refs}"


def show(key: str, value: float, unit: str = "", digits: int = 2) -> None:
    """Print ``value`` (measured here) beside the reference machines' value for ``key``.

    ``key`` is ``"dayNN.name"``; ``unit`` is ``"x"`` for a ratio, ``"ms"``, ``"GFLOP/s"``, ``"%"``...
    In a notebook the value is also attached to the output (metadata) for the maintainers' harvest.
    """
    if not isinstance(key, str) or not key.startswith("day") or "." not in key:
        raise ValueError(f"A reference key looks like 'day04.tvm_vs_eager', got {key!r}.")
    value = float(value)
    text = line(key, value, unit, digits)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is in the course's environment
        print(text)
        return
    if get_ipython() is None:
        print(text)
        return
    display({"text/plain": text}, raw=True,
            metadata={METADATA_KEY: {"key": key, "value": value, "unit": unit, "quick": config.quick()}})
