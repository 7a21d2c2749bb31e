"""Day 11's capstone table for the results: ``make capstone`` (``python -m helpers.maintainers.capstone``).

Runs ``zoo.run_model`` for each model at the largest budget every model shares (``zoo.equal_budget``)
and keeps the rows (operator mix, the engines' latencies, tuned TVM against each, kernel time by
operator, the layer comparisons) in ``results/capstone-<cpu>-<cores>cores.json``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from .. import machine
from ..results import results_path, save_record
from ..zoo import ZOO, equal_budget, run_model


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.maintainers.capstone", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(ZOO))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    info = machine.describe()
    budget = equal_budget(machine.cpu_target(), args.models)
    rows = []
    for name in args.models:
        print(f"{name} ...", flush=True)
        result = run_model(name, repeats=args.repeats, budget=budget)
        row = result.row()
        row["kernel time by operator (%)"] = {op: round(100 * s, 1) for op, s in result.profile.share_by_op().items()}
        for against, frame in result.layers.items():
            row[f"layers against {against}"] = frame.round(3).to_dict(orient="records")
        rows.append(row)
        print(json.dumps(row), flush=True)
    target = machine.cpu_target()
    path = results_path(target, "json", kind="capstone")
    save_record(path, machine=info.as_dict(), target=str(target), equal_budget=budget, rows=rows)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
