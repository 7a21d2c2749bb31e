"""A database's own settings file (``course_tuning.json``): how its kernels were prepared and its budget.

How the kernels were prepared (with or without weight prepacking, in which activation layout), so that
applying the database prepares them the same way, and the budget it was tuned with (trials per task,
whether in quick mode, what it was seeded from), so that a test run's tiny database is never mistaken
for a real one.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import config, nchwc
from ..errors import TuningDatabaseError


SETTINGS_FILE = "course_tuning.json"


def check_prepared_alike(work_dir: Path, prepack: bool, layout: str = nchwc.PLAIN) -> None:
    """Refuse to add kernels prepared one way to a database of kernels prepared another way."""
    if not (work_dir / SETTINGS_FILE).is_file():
        return
    if read_settings(work_dir).get("prepack") != prepack:
        raise TuningDatabaseError(
            f"{work_dir} holds a database tuned with prepack={not prepack}; its kernels "
            f"differ from those of prepack={prepack}. Tune into another directory."
        )
    if tuned_layout(work_dir) != layout:
        raise TuningDatabaseError(
            f"{work_dir} holds a database tuned with layout={tuned_layout(work_dir)!r}; its kernels "
            f"differ from those of layout={layout!r}. Tune into another directory."
        )


def write_settings(work_dir: Path, prepack: bool, trials_per_task: float, seeded_from: dict | None = None,
                    layout: str = nchwc.PLAIN) -> None:
    """Record how the kernels were prepared and add this run's budget to the database's."""
    check_prepared_alike(work_dir, prepack, layout)
    settings = read_settings(work_dir)
    settings["prepack"] = prepack
    if layout != nchwc.PLAIN:  # databases from before layouts were recorded are NCHW
        settings["layout"] = layout
    settings["trials_per_task"] = round_budget(settings.get("trials_per_task", 0) + trials_per_task)
    settings["quick"] = bool(settings.get("quick", False) or config.quick())
    if seeded_from is not None:
        settings["seeded_from"] = seeded_from
    save_settings(work_dir, settings)


def save_settings(work_dir: Path, settings: dict) -> None:
    (work_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=1) + "\n")


def round_budget(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 2)


def read_settings(work_dir: Path) -> dict:
    path = Path(work_dir) / SETTINGS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def budget(work_dir: str | Path) -> float | None:
    """Trials per task behind a database: tuned into it, plus those of the database it was seeded from.

    None when the database does not say (one tuned before the course recorded budgets).
    A budget capped by ``max_trials_global`` counts as the trials per task it allowed on average.
    """
    settings = read_settings(Path(work_dir))
    if "trials_per_task" not in settings:
        return None
    seeded = (settings.get("seeded_from") or {}).get("trials_per_task") or 0
    return round_budget(settings["trials_per_task"] + seeded)


def tuned_with_prepacking(work_dir: str | Path) -> bool:
    """True when the database was tuned with weight prepacking (its builds lift the weight arithmetic out of main)."""
    return bool(read_settings(Path(work_dir)).get("prepack", False))


def tuned_layout(work_dir: str | Path) -> str:
    """The convolutions' activation layout the database's kernels were fused with: ``NCHW`` or ``NCHW16c``..."""
    return read_settings(Path(work_dir)).get("layout", nchwc.PLAIN)


def tuned_in_quick_mode(work_dir: str | Path) -> bool:
    """True when any of the database's tuning ran in quick (test) mode: a tiny budget, not for learners."""
    return bool(read_settings(Path(work_dir)).get("quick", False))
