"""Ship a compiled model: the files a deployment needs, and a fresh process that runs them.

A deployable TVM model is a folder:

- ``model.so``: ``executable.export_library(...)``: the kernels as machine code plus
  the VM's bytecode and constants, in one shared library (linked by the C++ compiler);
- ``params.bin``: the weights, saved with ``tvm.runtime.save_param_dict_to_file``
  and keyed by the names of ``main``'s parameters;
- ``input_spec.json``: the input's name, shape and dtype (shapes are static in the code);
- ``run_model.py``: a loader that needs only TVM's *runtime* library, not the compiler.

``run_loader`` runs that loader in a fresh Python process (this environment's
interpreter), with its output captured, and the loader writes ``output.npy`` and
``run.json`` (which process ran it, with which TVM libraries, and the SHA-256 of
the output it wrote: what proves that a fresh process made ``output.npy``).

Introduced on Day 6.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from .capture import capture_stderr  # Day 6 and 13 call it as export.capture_stderr
from .errors import CourseError
from .models import ImportedModel

LIBRARY = "model.so"
PARAMS = "params.bin"
SPEC = "input_spec.json"
LOADER = "run_model.py"
INPUT = "input.npy"
OUTPUT = "output.npy"
RUN_RECORD = "run.json"  # the loader's note about its own run: process id, runtime only, SHA-256 of output.npy
# The prefix TVM gives the exported symbol of every kernel in the shared library.
KERNEL_SYMBOL_PREFIX = "__tvm_ffi_"


class ReloadError(CourseError, RuntimeError):
    """The fresh process could not load or run the exported model."""


def param_names(imported: ImportedModel, function: str = "main") -> list[str]:
    """Names of ``function``'s weight parameters (every parameter after the input), in order."""
    params = imported.mod[function].params
    return [str(p.name) for p in params[len(params) - imported.num_params :]]


def input_name(imported: ImportedModel, function: str = "main") -> str:
    """Name of ``function``'s first parameter: the model input."""
    return str(imported.mod[function].params[0].name)


def save_params(imported: ImportedModel, path: str | Path) -> Path:
    """Save the weights with TVM's own format, keyed by ``main``'s parameter names."""
    path = Path(path)
    tensors = {name: tvm.runtime.tensor(p.numpy()) for name, p in zip(param_names(imported), imported.params)}
    tvm.runtime.save_param_dict_to_file(tensors, str(path))
    return path


def write_input_spec(imported: ImportedModel, path: str | Path) -> Path:
    """The contract with the caller: input name, shape and dtype, and the weights' names."""
    path = Path(path)
    spec = {
        "input": {"name": input_name(imported), "shape": list(imported.input_shape), "dtype": imported.input_dtype},
        "params": param_names(imported),
        "tvm": tvm.__version__,
    }
    path.write_text(json.dumps(spec, indent=1))
    return path


LOADER_SOURCE = '''\
"""Run an exported TVM model in this process: python run_model.py DIR

Reads DIR/model.so, DIR/params.bin (if present), DIR/input_spec.json (if present)
and DIR/input.npy; writes DIR/output.npy, and DIR/run.json about the run (this
process's id, whether it loaded TVM's runtime only, the SHA-256 of output.npy),
which it also prints as one JSON line.
Set TVM_USE_RUNTIME_LIB=1 to load only TVM's runtime library (no compiler).
"""
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine


def run(directory: Path) -> dict:
    x = np.load(directory / "input.npy")
    spec_file = directory / "input_spec.json"
    if spec_file.exists():
        spec = json.loads(spec_file.read_text())["input"]
        if list(x.shape) != spec["shape"] or str(x.dtype) != spec["dtype"]:
            sys.exit(f"input.npy is {x.shape} {x.dtype}; the model was compiled for {spec['shape']} {spec['dtype']}")
    vm = VirtualMachine(tvm.runtime.load_module(str(directory / "model.so")), tvm.cpu())
    params_file = directory / "params.bin"
    params = dict(tvm.runtime.load_param_dict_from_file(str(params_file))) if params_file.exists() else {}
    vm.set_input("main", tvm.runtime.tensor(x), **params)  # weights matched to main() by name
    vm.invoke_stateful("main")
    out = vm.get_outputs("main")
    if not hasattr(out, "numpy"):  # a one-element tuple, as torch.export gives
        out = out[0]
    result = out.numpy()
    np.save(directory / "output.npy", result)
    info = {
        "output_shape": list(result.shape),
        "runtime_only": bool(tvm.base._RUNTIME_ONLY),
        "tvm_libraries": sorted(tvm.base._LOADED_LIBS),
        "pid": os.getpid(),
        "output_sha256": hashlib.sha256((directory / "output.npy").read_bytes()).hexdigest(),
    }
    (directory / "run.json").write_text(json.dumps(info))
    return info


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]))))
'''


def write_loader(directory: str | Path) -> Path:
    """Write ``run_model.py`` (the stand-alone loader) into ``directory``."""
    path = Path(directory) / LOADER
    path.write_text(LOADER_SOURCE)
    return path


@dataclass
class LoaderRun:
    """One run of the loader in a fresh process."""

    command: list[str]
    info: dict  # the loader's JSON line (run.json): output shape, runtime-only or not, TVM libraries, pid, output SHA-256
    stderr: str = field(repr=False, default="")  # captured, never shown unless asked for


def run_loader(directory: str | Path, runtime_only: bool = True, timeout: float = 300) -> LoaderRun:
    """Run ``run_model.py DIR`` with this environment's Python in a fresh process.

    stdout and stderr are captured (TVM logs to stderr even when all is well).
    ``runtime_only`` sets ``TVM_USE_RUNTIME_LIB=1``: the process loads TVM's runtime
    library only, as a deployment without the compiler would. A failure raises
    ``ReloadError`` with the end of the process's stderr.
    """
    directory = Path(directory)
    loader = directory / LOADER
    if not loader.exists():
        write_loader(directory)
    env = dict(os.environ)
    if runtime_only:
        env["TVM_USE_RUNTIME_LIB"] = "1"
    command = [sys.executable, str(loader), str(directory)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise ReloadError(f"The fresh process did not finish within {timeout} s.") from err
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise ReloadError(f"The fresh process failed (exit code {proc.returncode}):\n{tail}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    info = json.loads(lines[-1]) if lines else {}
    return LoaderRun(command=command, info=info, stderr=proc.stderr)


def file_sizes(directory: str | Path) -> dict[str, int]:
    """Size in bytes of every file in ``directory``, largest first."""
    files = [p for p in Path(directory).iterdir() if p.is_file()]
    return dict(sorted(((p.name, p.stat().st_size) for p in files), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class LibraryContents:
    """What ``export_library`` put into the shared library."""

    kernels: list[str]  # exported kernel functions (one per TensorIR kernel the VM calls)
    code_bytes: int  # machine code: the kernels and their wrappers
    executable_bytes: int  # the embedded VM executable: bytecode, constants, kernel table
    file_bytes: int


def _binutils(tool: str, *options: str, path: Path) -> str:
    """The output of a binutils tool (installed with the C++ compiler) on an exported library."""
    found = shutil.which(tool)
    if found is None:
        raise CourseError(f"`{tool}` (binutils) is not installed: it comes with the C++ compiler (apt install binutils).")
    if not path.exists():
        raise CourseError(f"No library at {path}: export it first with executable.export_library(path).")
    return subprocess.run([found, *options, str(path)], capture_output=True, text=True, check=True).stdout


def library_contents(path: str | Path) -> LibraryContents:
    """Read a library from ``export_library`` with ``nm`` (binutils, installed with the C++ compiler)."""
    path = Path(path)
    out = _binutils("nm", "-S", "--defined-only", path=path)
    kernels, code, blob = [], 0, 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 4:  # symbols without a size
            continue
        _, size, kind, name = parts
        if name == KERNEL_SYMBOL_PREFIX + "_library_bin":
            blob = int(size, 16)
        elif kind in "tT":
            code += int(size, 16)
            if kind == "T" and name.startswith(KERNEL_SYMBOL_PREFIX):
                kernels.append(name.removeprefix(KERNEL_SYMBOL_PREFIX))
    return LibraryContents(sorted(kernels), code, blob, path.stat().st_size)


VECTOR_REGISTER = re.compile(r"%([xyz]mm)\d+\b")


def vector_registers(path: str | Path) -> dict[str, int]:
    """How often the library's machine code names SIMD registers: ``xmm`` (128-bit, SSE), ``ymm``
    (256-bit, AVX/AVX2) and ``zmm`` (512-bit, AVX-512), from ``objdump -d`` (binutils).

    A library that names ``zmm`` registers runs only on CPUs with AVX-512: on others it stops with
    an illegal instruction. Build for the CPUs you ship to (Day 6, Exercise 2).
    """
    out = disassembly(path)
    counts = {"xmm": 0, "ymm": 0, "zmm": 0}
    for name in VECTOR_REGISTER.findall(out):
        counts[name] += 1
    return counts


def library_file(compiled, directory: str | Path) -> Path:
    """The shared library a ``CompiledModel`` runs: the compile cache's file, or its executable exported
    into ``directory``."""
    if compiled.library is not None:
        return Path(compiled.library)
    path = Path(directory) / LIBRARY
    with capture_stderr():
        compiled.executable.export_library(str(path))
    return path


def disassembly(path: str | Path) -> str:
    """The library's machine code as ``objdump -d`` prints it, one instruction a line with its operands."""
    return _binutils("objdump", "-d", "--no-show-raw-insn", path=Path(path))


def instruction_counts(path: str | Path, mnemonics: Sequence[str]) -> dict[str, int]:
    """How often each of ``mnemonics`` (``vpdpbusd``, ``vfmadd231ps``, ...) occurs in the library's machine
    code, from ``objdump -d``: what a kernel really runs on, whatever the source asked for (Day 12)."""
    out = disassembly(path)
    found = Counter(line.split()[1] for line in out.splitlines() if line.startswith(" ") and len(line.split()) > 1)
    return {name: found.get(name, 0) for name in mnemonics}


def runtime_files() -> dict[str, int]:
    """TVM's shared libraries in this environment and their sizes in bytes.

    A deployment needs ``libtvm_runtime.so`` and ``libtvm_ffi.so``; the much larger
    ``libtvm_compiler.so`` stays on the build machine.
    """
    import tvm_ffi

    folders = [Path(tvm.__file__).parent / "lib", Path(tvm_ffi.__file__).parent / "lib"]
    found = {}
    for folder in folders:
        for lib in sorted(folder.glob("*.so")):
            if "testing" not in lib.name:
                found[lib.name] = lib.stat().st_size
    return found
