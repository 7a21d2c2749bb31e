"""Accuracy on labelled data, with the interval a finite test set leaves (Days 12 and 15).

A share measured on n examples is an estimate: 99 % on 900 images means the true accuracy lies
somewhere around it, and two builds whose intervals overlap are not shown to differ. ``wilson`` gives
that interval; ``table`` puts each build's accuracy beside it, with how many of its answers differ
from a reference build's on the same images (paired, so it sees differences the accuracies hide).

Introduced on Day 12.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson interval of a proportion ``successes / trials``: the range that holds the true share with
    95 % confidence (unlike the normal approximation, it stays inside 0..1 near the ends)."""
    if trials <= 0:
        raise ValueError("an interval needs at least one trial")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must lie in 0..trials, got {successes} of {trials}")
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def table(predicted: dict[str, np.ndarray], labels: np.ndarray, reference: str) -> pd.DataFrame:
    """One row per build: images right, accuracy and its 95 % interval, and answers that differ from
    ``reference``'s (``differ_from_reference``). ``predicted`` maps each build's name to its class for every
    image of ``labels``."""
    labels = np.asarray(labels)
    if reference not in predicted:
        raise ValueError(f"No predictions for the reference {reference!r}; the builds are {sorted(predicted)}.")
    rows = []
    for name, classes in predicted.items():
        classes = np.asarray(classes)
        if classes.shape != labels.shape:
            raise ValueError(f"{name}: {classes.shape[0] if classes.ndim else 0} predictions for {len(labels)} labels.")
        right = int((classes == labels).sum())
        low, high = wilson(right, len(labels))
        rows.append({"build": name, "right": right, "images": len(labels), "accuracy": right / len(labels),
                     "low": low, "high": high,
                     "differ_from_reference": int((classes != predicted[reference]).sum())})
    return pd.DataFrame(rows)

