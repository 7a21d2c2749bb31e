"""Accuracy with its interval (helpers.accuracy, Days 12 and 15)."""

import numpy as np
import pytest

from helpers import accuracy


def test_wilson_matches_the_textbook_values():
    low, high = accuracy.wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = accuracy.wilson(894, 900)
    assert 0.985 < low < 0.986 and 0.996 < high < 0.997
    low, high = accuracy.wilson(50, 100)
    assert low == pytest.approx(1 - high) and low == pytest.approx(0.4038, abs=1e-4)


@pytest.mark.parametrize("successes, trials", [(1, 0), (-1, 5), (6, 5)])
def test_wilson_refuses_impossible_counts(successes, trials):
    with pytest.raises(ValueError):
        accuracy.wilson(successes, trials)


def test_table_counts_right_answers_and_differences_from_the_reference():
    labels = np.array([0, 1, 2, 3, 4])
    predicted = {"float": np.array([0, 1, 2, 3, 0]), "int8": np.array([0, 1, 2, 0, 4]), "same": np.array([0, 1, 2, 3, 0])}
    table = accuracy.table(predicted, labels, reference="float").set_index("build")
    assert list(table["right"]) == [4, 4, 4]
    assert list(table["differ_from_reference"]) == [0, 2, 0]
    assert table.loc["int8", "accuracy"] == 0.8
    assert table.loc["int8", "low"] < 0.8 < table.loc["int8", "high"]


def test_table_refuses_a_missing_reference_and_a_wrong_count():
    labels = np.array([0, 1, 2])
    with pytest.raises(ValueError, match="reference"):
        accuracy.table({"a": np.array([0, 1, 2])}, labels, reference="b")
    with pytest.raises(ValueError, match="2 predictions for 3 labels"):
        accuracy.table({"a": np.array([0, 1, 2]), "b": np.array([0, 1])}, labels, reference="a")
