import pytest

from helpers import models, profiling


@pytest.mark.timed  # compares two timings: run alone, with every core (tests/run_suite.py)
def test_kernel_times_add_up_to_the_end_to_end_time(mobilenet_compiled):
    # The hook's own cost and the VM's bookkeeping sit between the two; 25 % is the bound the course promises.
    # Hooked and plain runs take turns (profiling.profile), so steady load slows both alike; a burst that
    # lands on one of them gets a second profile, and the message reports both.
    profiles = [profiling.profile(mobilenet_compiled, models.example_input(), repeats=5)]
    if abs(profiles[0].kernel_ms / profiles[0].end_to_end_ms - 1) > 0.25:
        profiles.append(profiling.profile(mobilenet_compiled, models.example_input(), repeats=5))
    prof = profiles[-1]
    assert len(prof.kernels) > 20
    assert prof.kernel_ms == pytest.approx(prof.end_to_end_ms, rel=0.25), "kernels against end to end: " + "; then ".join(
        f"{p.kernel_ms:.1f} against {p.end_to_end_ms:.1f} ms" for p in profiles)
    shares = prof.share_by_op()
    assert sum(shares.values()) == pytest.approx(1.0)
    assert next(iter(shares)) == "conv2d", f"MobileNetV2's time should be mostly convolutions: {shares}"
    top = prof.top(5)
    assert [k.ms for k in top] == sorted((k.ms for k in prof.kernels), reverse=True)[:5]


def test_profile_round_trips_through_json(tiny_compiled, tiny_input, tmp_path):
    prof = profiling.profile(tiny_compiled, tiny_input, repeats=2)
    prof.save(tmp_path / "p.json")
    again = profiling.Profile.load(tmp_path / "p.json")
    assert again.top(3) == prof.top(3)
    assert again.end_to_end_ms == prof.end_to_end_ms
    assert again.share_by_op() == prof.share_by_op()


def test_profiling_leaves_the_vm_unhooked(tiny_compiled, tiny_input, monkeypatch):
    installed = []
    real = tiny_compiled.vm.set_instrument
    monkeypatch.setattr(tiny_compiled.vm, "set_instrument", lambda hook: (installed.append(hook), real(hook))[1])
    profiling.profile(tiny_compiled, tiny_input, repeats=2)
    assert len(installed) >= 4, "profiling installs its hook for each run"
    assert installed[-1] is None, "profiling left its hook in the VM: every later call would pay for it"
