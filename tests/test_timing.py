import itertools
import time

import psutil
import pytest

from helpers import timing


@pytest.mark.timed
def test_measure_reports_median_and_spread_per_backend():
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1
        time.sleep(0.001)

    def slow():
        calls["slow"] += 1
        time.sleep(0.004)

    results = timing.measure({"fast": fast, "slow": slow}, batch=8, warmup=2, repeats=7)
    by = {t.label: t for t in results}
    assert calls == {"fast": 2 + 7 * 2, "slow": 2 + 7 * 2}  # warm-up + repeats, each after a settling call
    assert len(by["fast"].times_ms) == 7
    assert by["slow"].median_ms > by["fast"].median_ms * 2  # a ratio measured in one run
    assert by["fast"].q1_ms <= by["fast"].median_ms <= by["fast"].q3_ms
    assert by["fast"].images_per_s == pytest.approx(8 / by["fast"].median_ms * 1000)
    assert set(by["fast"].as_record()) >= {"backend", "batch", "median_ms", "iqr_ms", "images_per_s"}


def test_sync_runs_after_every_call():
    log = []
    timing.measure({"a": lambda: log.append("call")}, warmup=1, repeats=3, sync=lambda: log.append("sync"))
    assert log == ["call", "sync"] * 4  # one backend: each call already follows one of its own, no settling


def test_each_timed_call_follows_a_call_of_the_same_backend_unless_calls_are_long():
    log = []

    def backend(name, seconds=0.0):
        def run():
            log.append(name)
            time.sleep(seconds)
        return run

    timing.measure({"a": backend("a"), "b": backend("b")}, warmup=1, repeats=2)
    assert log == ["a", "b"] + ["a", "a", "b", "b"] * 2
    log.clear()
    timing.measure({"a": backend("a"), "b": backend("b")}, warmup=1, repeats=2, settle=False)
    assert log == ["a", "b"] + ["a", "b"] * 2
    log.clear()
    timing.measure({"a": backend("a"), "slow": backend("slow", timing.SETTLE_LIMIT_S + 0.05)}, warmup=1, repeats=2)
    assert log == ["a", "slow"] + ["a", "a", "slow"] * 2  # a slow call needs no settling


def test_zero_repeats_is_an_error():
    with pytest.raises(ValueError, match="repeats"):
        timing.measure({"a": lambda: None}, repeats=0)


def test_table_speedup_against_baseline():
    ts = [timing.Timing("eager", 1, [10.0]), timing.Timing("tvm", 1, [5.0]), timing.Timing("tvm", 4, [8.0]),
          timing.Timing("eager", 4, [40.0])]
    frame = timing.table(ts, baseline="eager")
    speed = dict(zip(zip(frame.backend, frame.batch), frame.speedup_vs_eager))
    assert speed[("tvm", 1)] == 2.0 and speed[("tvm", 4)] == 5.0 and speed[("eager", 1)] == 1.0
    with pytest.raises(ValueError, match="No timing labelled 'torch'"):
        timing.table(ts, baseline="torch")


def test_runners_time_real_backends(tiny_model, tiny_compiled, tiny_input):
    results = timing.measure(
        {"eager": timing.torch_runner(tiny_model, tiny_input), "tvm": timing.tvm_runner(tiny_compiled, tiny_input)},
        batch=2, warmup=1, repeats=3,
    )
    assert [t.label for t in results] == ["eager", "tvm"]
    assert all(t.median_ms > 0 for t in results)



def _spinners() -> int:
    """This process's children running busy_cores' spin loop (not another test worker's)."""
    count = 0
    for child in psutil.Process().children():
        try:
            count += "while True: pass" in " ".join(child.cmdline())
        except psutil.NoSuchProcess:  # the process ended while we looked
            pass
    return count


def test_busy_cores_run_while_the_block_runs_and_stop_after():
    before = _spinners()
    with timing.busy_cores(2):
        assert _spinners() == before + 2
    assert _spinners() == before
    with pytest.raises(ValueError, match="0 or more"):
        with timing.busy_cores(-1):
            pass


def test_unreliable_flags_a_wide_spread_and_not_a_tight_one():
    tight = timing.Timing("tight", 1, [10.0, 10.2, 10.4, 10.6, 11.0])  # IQR 0.4 ms on 10.4: 4 %
    wide = timing.Timing("wide", 1, [8.0, 9.0, 10.0, 13.0, 20.0])  # IQR 4 ms on 10: 40 %
    assert not timing.unreliable(tight) and timing.unreliable(wide)
    assert timing.unreliable(wide.as_record()) and wide.as_record()["unreliable"] is True
    at_limit = {"median_ms": 10.0, "iqr_ms": 10.0 * timing.UNRELIABLE_SPREAD}
    assert not timing.unreliable(at_limit)
    assert timing.unreliable({**at_limit, "iqr_ms": at_limit["iqr_ms"] + 0.01})


def test_measure_with_retry_measures_every_backend_again_when_one_is_unreliable(monkeypatch):
    steady, noisy = [10.0, 10.1, 10.2, 10.3], [5.0, 10.0, 20.0, 40.0]
    calls = []

    def fake_measure(backends, **options):
        calls.append(sorted(backends))
        second = len(calls) > 1
        return [timing.Timing(name, 1, steady if name == "a" or (second and name == "b") else noisy)
                for name in backends]

    monkeypatch.setattr(timing, "measure", fake_measure)
    backends = {"a": lambda: None, "b": lambda: None, "c": lambda: None}
    result = timing.measure_with_retry(backends, repeats=4)
    assert calls == [["a", "b", "c"], ["a", "b", "c"]]  # all again: every ratio stays within one run
    assert [t.label for t in result] == ["a", "b", "c"]  # in the order asked
    assert [timing.unreliable(t) for t in result] == [False, False, True]  # b settled, c is still noise
    calls.clear()
    timing.measure_with_retry({"a": lambda: None}, repeats=4)
    assert calls == [["a"]]  # nothing noisy: measured once


def test_blocks_time_several_calls_in_a_row_after_settling_for_a_while():
    calls = []

    def backend(name, seconds):
        def run():
            start = time.perf_counter()
            time.sleep(seconds)
            calls.append((name, time.perf_counter() - start))
        return run

    got = timing.measure({"a": backend("a", 0.004), "b": backend("b", 0.001)}, warmup=0, repeats=5, settle_s=0.01, block=2)
    assert [len(t.times_ms) for t in got] == [5, 5]
    runs = [(name, [s for _, s in group]) for name, group in itertools.groupby(calls, key=lambda c: c[0])]
    assert [name for name, _ in runs] == ["a", "b"] * 3  # rounds of blocks, still alternating
    for (name, seconds), timed in zip(runs, [2, 2, 2, 2, 1, 1]):  # the last round times the one call left
        settling = seconds[:-timed]
        assert settling and sum(settling) >= 0.01 - 1e-3, (name, settling)  # at least settle_s of its own calls
        assert sum(settling[:-1]) < 0.01 + 1e-3, (name, settling)  # and no more calls than that took
    with pytest.raises(ValueError, match="block must be at least 1"):
        timing.measure({"a": backend("a", 0)}, repeats=1, block=0)


def test_measure_engines_uses_the_engine_settings(monkeypatch):
    seen = {}
    monkeypatch.setattr(timing, "measure", lambda backends, **options: seen.update(options) or [])
    timing.measure_engines({"a": lambda: None}, repeats=3)
    assert seen == {"settle_s": timing.PEER_SETTLE_S, "block": timing.PEER_BLOCK, "repeats": 3}


def test_versus_calls_a_lead_only_where_the_interquartile_ranges_are_apart():
    def t(label, *times):
        return timing.Timing(label, 1, list(times))

    runs = [t("fast", 1.0, 1.1, 1.2, 1.3), t("slow", 2.0, 2.1, 2.2, 2.3), t("close", 1.1, 1.2, 1.3, 1.4),
            t("noisy", 1.0, 2.0, 4.0, 8.0)]
    assert timing.versus(runs, "fast", "slow") == "fast is 1.87x faster than slow (their interquartile ranges apart)"
    assert timing.versus(runs, "slow", "fast", called="the engine") == (
        "slow is 1.87x slower than the engine (their interquartile ranges apart)")
    close = timing.versus(runs, "fast", "close")
    assert close.startswith("fast runs at 1.09x the speed of close, inside the spread") and "neither is shown faster" in close
    assert timing.versus(runs, "fast", "noisy").endswith("(unreliable: noisy spread too wide)")
    with pytest.raises(ValueError, match="No timing labelled 'gone'"):
        timing.versus(runs, "gone", "fast")
