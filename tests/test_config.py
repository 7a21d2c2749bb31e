"""helpers.config: the quick-mode switch and the grading load."""

import pytest

from helpers import config


def test_grading_load_defaults_to_no_busy_core_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv(config.GRADING_LOAD_ENV, raising=False)
    assert config.grading_load() == 0
    monkeypatch.setenv(config.GRADING_LOAD_ENV, "1")
    assert config.grading_load() == 1
    monkeypatch.setenv(config.GRADING_LOAD_ENV, "one")
    with pytest.raises(ValueError, match="number of cores"):
        config.grading_load()


def test_pick_follows_quick_mode(monkeypatch):
    monkeypatch.setenv(config.QUICK_ENV, "1")
    assert config.quick() and config.pick(100, 10) == 10
    monkeypatch.setenv(config.QUICK_ENV, "0")
    assert not config.quick() and config.pick(100, 10) == 100
