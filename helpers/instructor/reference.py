"""Harvest a reference machine's values from full-size executions of the days (``helpers.reference``).

Every ``reference.show`` call of a day leaves its key and value in its output's metadata. This
command reads the executed notebooks of a full-size run (by default the website's cache,
``build/site/executed/full/``, which ``make site`` fills), refuses any made in reduced (quick)
mode, and writes ``results/reference/<cpu>-<cores>cores.json``: this machine's name, the date, the
commit and every value, which each day then prints beside the learner's own.

    python -m helpers.instructor.reference [EXECUTED_NOTEBOOK ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from .. import machine
from ..reference import METADATA_KEY, REFERENCE_ROOT
from .grading import REPO
from .results_index import CPU_NAMES


def values(notebook: nbformat.NotebookNode) -> dict[str, dict]:
    """The reference values an executed notebook shows, by key (the last one where a key repeats)."""
    found = {}
    for cell in notebook.cells:
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get(METADATA_KEY)
            if meta:
                if meta.get("quick"):
                    raise ValueError(f"{meta['key']} was measured in reduced (quick) mode: a reference is full size")
                found[meta["key"]] = {"value": meta["value"], "unit": meta.get("unit", "")}
    return found


def harvest(paths: list[Path], root: Path = REFERENCE_ROOT) -> Path:
    """Write this machine's reference file from executed notebooks; keys already recorded here and not
    in ``paths`` are kept (a day executed again replaces only its own values)."""
    info = machine.describe()
    dest = root / f"{info.cpu}-{info.cores}cores.json"
    old = json.loads(dest.read_text()) if dest.is_file() else {}
    collected = dict(old.get("values", {}))
    for path in paths:
        collected.update(values(nbformat.read(path, as_version=4)))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    record = {
        "machine": f"{CPU_NAMES.get(info.cpu, info.cpu)} ({info.cpu}, {info.cores} cores)",
        "cpu": info.cpu,
        "cores": info.cores,
        "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "how": "full-size executions of the days' source notebooks (make site), harvested by "
               "python -m helpers.instructor.reference",
        "values": dict(sorted(collected.items())),
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(record, indent=1) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in args] or sorted((REPO / "build" / "site" / "executed" / "full").glob("*.ipynb"))
    if not paths:
        print("error: no executed notebooks: run `make site` (full size) first, or name them", file=sys.stderr)
        return 1
    dest = harvest(paths)
    print(f"{dest}: {len(json.loads(dest.read_text())['values'])} values from {len(paths)} notebook(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
