"""TVM's builds timed in a process of their own, where TVM's threads spin as they do by default.

After a parallel kernel, TVM's pool threads spin for a while, waiting for the next one
(``TVM_THREAD_POOL_SPIN_COUNT``, read once per process, the first time the pool runs). Day 13 turns the
spinning off for its whole process, so that PyTorch's threads do not queue behind TVM's when a model calls
both in turn; but then every parallel TVM kernel pays to wake its threads, and a TVM-only build runs slower
than it would by default. ``time_with_default_spinning`` times TVM builds in a child process with the
setting left alone, interleaved there as ``timing.measure_engines`` does, so that the TVM-only rows can be
read both ways. The child registers the course's PyTorch functions (``helpers.dispatch``), so dispatched
builds run there too. ``time_kernels_with_default_spinning`` does the same for single kernels (section 1's
depthwise convolution), timed there as ``kernels.measure`` times them here.

Introduced on Day 13.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import tvm

from .build import CompiledModel, relative_error
from .config import REPO
from .errors import CourseError, ParityError
from .export import library_file
from .timing import Timing

SPIN_ENV = "TVM_THREAD_POOL_SPIN_COUNT"
RTOL = 1e-4  # a build in the child against the same build here: the same code on the same numbers

_CHILD = r'''
import json, os, sys
if "TVM_THREAD_POOL_SPIN_COUNT" in os.environ:
    sys.exit("TVM_THREAD_POOL_SPIN_COUNT is set: this process must run with TVM's default spinning")
import numpy as np
import tvm
from tvm import relax
from helpers import dispatch, timing  # dispatch registers the course's PyTorch functions

spec = json.loads(open(sys.argv[1]).read())
x = tvm.runtime.tensor(np.load(spec["input"]))
weights = np.load(spec["weights"])
runners = {}
for label, library in spec["libraries"].items():
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu())
    params = [tvm.runtime.tensor(weights[f"arr_{i}"]) for i in range(len(weights.files))]
    try:
        params = list(vm["main_transform_params"](params))  # what build.transform_params does at load
    except (AttributeError, KeyError, RuntimeError, ValueError):
        pass
    main = vm["main"]
    runners[label] = lambda main=main, params=params: main(x, *params)
outputs = {}
for label, run in runners.items():
    out = run()
    outputs[label] = np.asarray((out if hasattr(out, "numpy") else out[0]).numpy()).ravel().tolist()
found = timing.measure_engines(runners, repeats=spec["repeats"])
print(json.dumps({"times": {t.label: t.times_ms for t in found}, "outputs": outputs}))
'''


def time_with_default_spinning(builds: Mapping[str, CompiledModel], weights: Sequence, x, repeats: int,
                               timeout: float = 900) -> list[Timing]:
    """``builds`` (label -> a build of one model, all taking ``weights``, the imported model's parameters, before
    any ``main_transform_params``) on input ``x``, timed interleaved in a child process with TVM's default
    spinning. Each build's first output there is checked against the same build's here (``ParityError``
    otherwise); ``CourseError`` with the end of its stderr when the child fails."""
    with tempfile.TemporaryDirectory(prefix="spinning-") as tmp:
        folder = Path(tmp)
        libraries = {}
        for i, (label, compiled) in enumerate(builds.items()):
            (folder / str(i)).mkdir()
            libraries[label] = str(library_file(compiled, folder / str(i)))
        array = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
        np.save(folder / "input.npy", array)
        np.savez(folder / "weights.npz", *[w.numpy() if hasattr(w, "numpy") else np.asarray(w) for w in weights])
        spec = {"input": str(folder / "input.npy"), "weights": str(folder / "weights.npz"),
                "libraries": libraries, "repeats": repeats}
        result = _run_child(_CHILD, folder, spec, timeout)
    for label, compiled in builds.items():
        here = np.asarray(compiled(x)).ravel()
        error = relative_error(np.asarray(result["outputs"][label], dtype=here.dtype), here)
        if error > RTOL:
            raise ParityError(f"{label} computed other numbers in the timing process (relative error {error:.1e}): "
                              "were the weights given in the order main() takes them, before any transform?")
    return [Timing(label, 1, samples) for label, samples in result["times"].items()]


_KERNEL_CHILD = r'''
import json, os, sys
if "TVM_THREAD_POOL_SPIN_COUNT" in os.environ:
    sys.exit("TVM_THREAD_POOL_SPIN_COUNT is set: this process must run with TVM's default spinning")
import numpy as np
import tvm
from tvm import relax
from helpers import kernels

spec = json.loads(open(sys.argv[1]).read())
inputs = [tvm.runtime.tensor(np.load(path)) for path in spec["inputs"]]
out = tvm.runtime.tensor(np.zeros(spec["out_shape"], dtype=spec["out_dtype"]))
runners, outputs = {}, {}
for label, library in spec["libraries"].items():
    loaded = tvm.runtime.load_module(library)
    if loaded.implements_function("vm_load_executable"):  # a Relax executable: main(inputs) returns the output
        main = relax.VirtualMachine(loaded, tvm.cpu())["main"]
        runners[label] = lambda main=main: main(*inputs)
        outputs[label] = runners[label]().numpy().ravel().tolist()
    else:  # a kernel: main(inputs, output)
        main = loaded["main"]
        runners[label] = lambda main=main: main(*inputs, out)
        runners[label]()
        outputs[label] = out.numpy().ravel().tolist()
found = kernels.measure(runners, repeats=spec["repeats"])
print(json.dumps({"times": {t.label: t.times_ms for t in found}, "outputs": outputs}))
'''


def time_kernels_with_default_spinning(libraries: Mapping[str, tvm.runtime.Module | tvm.runtime.Executable],
                                       inputs: Sequence[np.ndarray], expected: np.ndarray,
                                       repeats: int | None = None, timeout: float = 600) -> list[Timing]:
    """Single kernels timed with ``kernels.measure`` in a child process with TVM's default spinning:
    ``kernels.build``'s modules (``main(*inputs, output)``) or Relax executables (``main(*inputs)``, what
    ``tvm.compile`` of a Relax module returns). Each one's output there is checked against ``expected``
    (``ParityError`` otherwise); ``CourseError`` with the end of its stderr when the child fails."""
    with tempfile.TemporaryDirectory(prefix="spinning-") as tmp:
        folder = Path(tmp)
        paths = []
        for i, array in enumerate(inputs):
            paths.append(str(folder / f"input{i}.npy"))
            np.save(paths[-1], np.asarray(array))
        files = {}
        for i, (label, library) in enumerate(libraries.items()):
            files[label] = str(folder / f"kernel{i}.so")
            library.export_library(files[label])
        expected = np.asarray(expected)
        spec = {"inputs": paths, "libraries": files, "out_shape": list(expected.shape), "out_dtype": str(expected.dtype),
                "repeats": repeats}
        result = _run_child(_KERNEL_CHILD, folder, spec, timeout)
    for label in libraries:
        error = relative_error(np.asarray(result["outputs"][label], dtype=expected.dtype).reshape(expected.shape), expected)
        if error > RTOL:
            raise ParityError(f"{label} computed other numbers in the timing process (relative error {error:.1e}).")
    return [Timing(label, 1, samples) for label, samples in result["times"].items()]


def _run_child(script: str, folder: Path, spec: dict, timeout: float) -> dict:
    """``script`` run in a child process without ``TVM_THREAD_POOL_SPIN_COUNT``, given ``spec`` (written to
    ``folder``); returns the JSON the child printed last."""
    env = {k: v for k, v in os.environ.items() if k != SPIN_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    (folder / "spec.json").write_text(json.dumps(spec))
    (folder / "child.py").write_text(script)
    try:
        proc = subprocess.run([sys.executable, str(folder / "child.py"), str(folder / "spec.json")],
                              capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise CourseError(f"The timing process did not finish within {timeout:.0f} s.") from err
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise CourseError(f"The timing process failed (exit code {proc.returncode}):\n{tail}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
