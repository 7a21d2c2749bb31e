"""The class-size measurement (docs/hub.md, "How big a machine") measures what it says: each learner's kernel
runs as the hub runs a learner's (one core, round-robin; threads sized to it; 8 GB of address space; full size,
no compile cache), and a kernel's peak memory is its own."""

import json
import os

import nbformat

from helpers.instructor import class_size

HELD_GB = 0.4


def test_each_learner_runs_as_the_hub_runs_one_and_its_kernel_peak_is_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_COURSE_QUICK", "1")  # removed for the learners: they run at full size
    seen = tmp_path / "seen"
    seen.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "tvm-course", "display_name": "TVM course (Python 3.11)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(
        "import json, os, resource, time\n"
        f"held = bytearray({int(HELD_GB * 1024 ** 3)})\n"
        "time.sleep(1.5)\n"
        f"json.dump({{'cores': sorted(os.sched_getaffinity(0)), 'as': resource.getrlimit(resource.RLIMIT_AS)[0],\n"
        "           'env': {k: os.environ.get(k) for k in ('TVM_COURSE_QUICK', 'OMP_NUM_THREADS', 'TVM_NUM_THREADS', "
        "'TVM_COURSE_NO_CACHE')}},\n"
        f"          open({str(seen)!r} + f'/{{os.getpid()}}.json', 'w'))")]
    nbformat.write(nb, tmp_path / "tiny.ipynb")

    got = class_size.run_class([tmp_path / "tiny.ipynb"], learners=2, sample_s=0.2)

    assert [r["learner"] for r in got["runs"]] == [0, 1]
    assert all(HELD_GB <= r["kernel_peak_rss_gb"] < HELD_GB + 1 for r in got["runs"]), got["runs"]
    assert got["machine_memory_peak_gb"] >= HELD_GB, got
    kernels = [json.loads(p.read_text()) for p in seen.glob("*.json")]
    assert len(kernels) == 2
    assert all(len(k["cores"]) == 1 and k["as"] == class_size.ADDRESS_SPACE_GB * 1024 ** 3 for k in kernels), kernels
    assert all(k["env"] == {"TVM_COURSE_QUICK": None, "OMP_NUM_THREADS": "1", "TVM_NUM_THREADS": "1",
                            "TVM_COURSE_NO_CACHE": "1"} for k in kernels), kernels
    if len(os.sched_getaffinity(0)) > 1:  # round-robin: two learners on two cores
        assert len({k["cores"][0] for k in kernels}) == 2
